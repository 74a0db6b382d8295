#include "http_front/worker_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace k3 {

namespace v1 = k3serve::v1;

bool GenerateCall::Next(v1::GenerateResponse* response) {
  if (has_first_) {
    has_first_ = false;
    *response = std::move(first_);
    return true;
  }
  return reader_->Read(response);
}

GenerateCall::~GenerateCall() {
  if (reader_ == nullptr || finished_) return;
  context_.TryCancel();
  reader_->Finish();
}

absl::Status GenerateCall::Finish() {
  finished_ = true;
  return FromGrpcStatus(reader_->Finish());
}

WorkerPool::WorkerPool(const std::vector<std::string>& addresses, const ClientTls& tls,
                       std::string auth_token)
    : auth_token_(std::move(auth_token)) {
  // An address that resolves to several workers (dns:///a headless Service) spreads its calls
  // over all of them, not only the first.
  grpc::ChannelArguments arguments;
  arguments.SetLoadBalancingPolicyName("round_robin");
  for (const std::string& address : addresses) {
    stubs_.push_back({address, v1::K3Serve::NewStub(tls.Connect(address, arguments))});
  }
}

absl::StatusOr<std::unique_ptr<GenerateCall>> WorkerPool::Start(
    const v1::GenerateRequest& request, const std::string& traceparent) {
  absl::Status last = absl::UnavailableError("no attention worker");
  for (size_t attempt = 0; attempt < stubs_.size(); ++attempt) {
    const Worker& worker = stubs_[next_.fetch_add(1) % stubs_.size()];
    std::unique_ptr<GenerateCall> call(new GenerateCall());
    AddBearer(auth_token_, &call->context_);
    if (!traceparent.empty()) call->context_.AddMetadata("traceparent", traceparent);
    call->reader_ = worker.stub->Generate(&call->context_, request);
    if (call->reader_->Read(&call->first_)) {
      call->has_first_ = true;
      return call;
    }
    absl::Status status = call->Finish();
    if (status.ok()) {
      return absl::InternalError(
          absl::StrCat("the Generate stream from ", worker.address, " ended without a message"));
    }
    if (!absl::IsUnavailable(status)) return status;
    last = absl::UnavailableError(
        absl::StrCat("attention worker ", worker.address, ": ", status.message()));
  }
  return last;
}

absl::Status WorkerPool::Ping(absl::Duration timeout) {
  absl::Status last = absl::UnavailableError("no attention worker");
  for (const Worker& worker : stubs_) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    AddBearer(auth_token_, &context);
    v1::ModelInfo info;
    const grpc::Status status = worker.stub->GetModelInfo(&context, {}, &info);
    if (status.ok()) return absl::OkStatus();
    last = absl::UnavailableError(
        absl::StrCat("attention worker ", worker.address, ": ", status.error_message()));
  }
  return last;
}

}  // namespace k3
