#include "cluster/grpc_server.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/health.grpc.pb.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, const std::vector<grpc::Service*>& services) {
  if (options.address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC listen address '", options.address, "' is not host:port"));
  }
  // A process-wide switch that gRPC documents as not thread-safe: flip it exactly once.
  static std::once_flag enable_health;
  std::call_once(enable_health, [] { grpc::EnableDefaultHealthCheckService(true); });

  grpc::ServerBuilder builder;
  int port = 0;
  const bool tls = options.credentials != nullptr;
  builder.AddListeningPort(options.address,
                           tls ? options.credentials : grpc::InsecureServerCredentials(), &port);
  if (options.max_receive_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  }
  // Without this two servers can bind one port and silently split its calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    if (server != nullptr) server->Shutdown();
    return absl::UnavailableError(absl::StrCat(
        "cannot start a gRPC server on ", options.address,
        tls ? " (address in use or not bindable, or --tls-cert and --tls-key are not a valid "
              "certificate and its key?)"
            : " (address in use or not bindable?)"));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  CHECK(health != nullptr) << "the default health service is enabled above";
  health->SetServingStatus("", false);
  for (const std::string& name : options.health_services) health->SetServingStatus(name, false);
  LOG(INFO) << "gRPC server listening on " << options.address << " (port " << port << ")"
            << (tls ? " with TLS" : " in plaintext");
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(server), port));
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(const std::string& service, bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  server_->GetHealthCheckService()->SetServingStatus(service, serving);
}

std::shared_ptr<grpc::Channel> GrpcServer::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void GrpcServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    server_->GetHealthCheckService()->Shutdown();
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

absl::StatusOr<bool> CheckServing(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& service, absl::Duration timeout) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace k3
