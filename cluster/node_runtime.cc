#include "cluster/node_runtime.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/node_process.h"
#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {
// How often the main thread looks for a stop signal or a failure: the latency of Ctrl-C.
constexpr absl::Duration kWatchInterval = absl::Milliseconds(50);
}  // namespace

int RunNode(const std::string& name, std::unique_ptr<RoleHooks> role) {
  StopSignals signals;  // before Start creates any thread
  absl::Status status = role->Start();
  if (!status.ok()) {
    LOG(ERROR) << name << " did not start: " << status;
  } else {
    for (;;) {
      if (const int signal_number = signals.Poll(); signal_number != 0) {
        const absl::Status accepted = role->AcceptStop();
        if (accepted.ok()) {
          LOG(INFO) << name << " got signal " << signal_number << "; shutting down";
          break;
        }
        LOG(WARNING) << name << " got signal " << signal_number
                     << " but keeps serving: " << accepted.message();
      }
      if (status = role->Failure(); !status.ok()) {
        LOG(ERROR) << name << " failed: " << status;
        break;
      }
      if (role->Finished()) {
        LOG(INFO) << name << " finished its work; shutting down";
        break;
      }
      absl::SleepFor(kWatchInterval);
    }
  }
  role->Shutdown();
  return status.ok() ? 0 : 1;
}

absl::StatusOr<std::unique_ptr<NodeEndpoints>> NodeEndpoints::Start(
    NodeEndpointsOptions options) {
  std::unique_ptr<NodeEndpoints> endpoints(new NodeEndpoints(std::move(options)));
  const NodeEndpointsOptions& o = endpoints->options_;
  K3_ASSIGN_OR_RETURN(ClientTls client_tls, LoadClientTls(o.flags.tls));
  endpoints->client_tls_ = std::move(client_tls);
  GrpcServerOptions server_options;
  server_options.address = HostPort(o.flags.host, o.flags.port);
  K3_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      LoadServerCredentials(o.flags.tls));
  server_options.credentials = std::move(credentials);
  server_options.max_receive_message_bytes = o.max_receive_message_bytes;
  if (!o.readiness_service.empty()) server_options.health_services = {o.readiness_service};
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
                      GrpcServer::Start(server_options, o.services));
  endpoints->server_ = std::move(server);
  endpoints->server_->SetServing("", true);
  endpoints->advertised_host_ = AdvertisedHost(o.flags.host);
  endpoints->grpc_address_ = HostPort(endpoints->advertised_host_, endpoints->server_->port());
  if (o.flags.metrics_port >= 0) {
    MetricsHttpOptions http_options;
    http_options.host = o.flags.host;
    http_options.port = o.flags.metrics_port;
    NodeEndpoints* self = endpoints.get();
    std::function<absl::Status()> readiness = o.readiness;
    if (!readiness) {
      readiness = [self] {
        return self->ready() ? absl::OkStatus() : absl::UnavailableError("not ready");
      };
    }
    K3_ASSIGN_OR_RETURN(
        std::unique_ptr<MetricsHttpServer> http,
        MetricsHttpServer::Start(http_options, &DefaultMetrics(), std::move(readiness)));
    endpoints->http_ = std::move(http);
  }
  return endpoints;
}

NodeEndpoints::~NodeEndpoints() { Stop(); }

void NodeEndpoints::Register(pb::NodeInfo node, CoordinatorCallbacks callbacks,
                             std::function<std::vector<uint64_t>()> take_broken_device_channels) {
  CHECK(client_ == nullptr) << "Register is called once";
  CHECK_NE(options_.role, pb::ROLE_UNSPECIFIED) << "a standalone node does not register";
  node.set_role(options_.role);
  node.set_grpc_address(grpc_address_);
  if (http_) node.set_metrics_address(HostPort(advertised_host_, http_->port()));
  CoordinatorClientOptions client_options;
  client_options.coordinator_address = options_.flags.coordinator;
  client_options.tls = client_tls_;
  client_options.node = node;
  client_options.take_broken_device_channels = std::move(take_broken_device_channels);
  LOG(INFO) << pb::Role_Name(options_.role) << " serving gRPC on " << grpc_address_
            << (http_ ? absl::StrCat(", metrics on port ", http_->port()) : "")
            << "; registering with the coordinator at " << options_.flags.coordinator;
  client_ = std::make_unique<CoordinatorClient>(std::move(client_options), std::move(callbacks));
  // Only now: the callbacks may reach the client through client(), which must not be null then.
  client_->Start();
}

void NodeEndpoints::SetReady(bool ready) {
  ready_ = ready;
  if (server_ != nullptr && !options_.readiness_service.empty()) {
    server_->SetServing(options_.readiness_service, ready);
  }
}

bool NodeEndpoints::ready() const { return ready_; }

void NodeEndpoints::Leave() {
  if (client_) client_->Stop();
}

void NodeEndpoints::Stop() {
  if (stopped_.exchange(true)) return;
  SetReady(false);
  Leave();
  if (http_) http_->Stop();
  // Null when Start failed before the server started.
  if (server_) server_->Shutdown(options_.shutdown_grace);
}

}  // namespace k3
