#include "http_front/worker_pool.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_server.h"
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
  Release();
  if (reader_ == nullptr || finished_) return;
  context_.TryCancel();
  reader_->Finish();
}

absl::Status GenerateCall::Finish() {
  finished_ = true;
  Release();
  return FromGrpcStatus(reader_->Finish());
}

void GenerateCall::Release() {
  if (load_ == nullptr) return;
  load_->fetch_sub(1);
  load_ = nullptr;
}

WorkerPool::WorkerPool(const std::vector<std::string>& addresses, const ClientTls& tls,
                       std::string auth_token)
    : auth_token_(std::move(auth_token)) {
  // An address that resolves to several workers (dns:///a headless Service) spreads its calls
  // over all of them, not only the first.
  grpc::ChannelArguments arguments;
  arguments.SetLoadBalancingPolicyName("round_robin");
  for (const std::string& address : addresses) AddWorker(address, tls.Connect(address, arguments));
}

WorkerPool::WorkerPool(std::string name, std::shared_ptr<grpc::Channel> channel,
                       std::string auth_token)
    : auth_token_(std::move(auth_token)) {
  AddWorker(std::move(name), std::move(channel));
}

void WorkerPool::AddWorker(std::string address, std::shared_ptr<grpc::Channel> channel) {
  auto worker = std::make_unique<Worker>();
  worker->address = std::move(address);
  worker->channel = std::move(channel);
  worker->stub = v1::K3Serve::NewStub(worker->channel);
  workers_.push_back(std::move(worker));
}

std::vector<size_t> WorkerPool::Order(absl::Span<const int32_t> prompt) {
  const size_t n = workers_.size();
  const size_t start = next_.fetch_add(1) % n;
  const int64_t now = absl::ToUnixNanos(absl::Now());
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i) order.push_back((start + i) % n);
  auto key = [&](size_t i) {
    const Worker& w = *workers_[i];
    return std::make_pair(w.down_until_ns.load() > now, w.load->load());
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const std::optional<std::pair<int, int64_t>> hint = affinity_.Lookup(prompt);
  if (hint.has_value()) {
    const size_t preferred = static_cast<size_t>(hint->first);
    const auto [down, load] = key(preferred);
    if (!down && load <= key(order.front()).second + kAffinitySlack) {
      order.erase(std::find(order.begin(), order.end(), preferred));
      order.insert(order.begin(), preferred);
    }
  }
  return order;
}

std::vector<int> WorkerPool::Loads() const {
  std::vector<int> loads;
  for (const auto& worker : workers_) loads.push_back(worker->load->load());
  return loads;
}

void WorkerPool::AddAuth(grpc::ClientContext* context) const { AddBearer(auth_token_, context); }

absl::StatusOr<std::unique_ptr<GenerateCall>> WorkerPool::Start(
    const v1::GenerateRequest& request, const std::string& traceparent,
    absl::Span<const int32_t> affinity_prompt) {
  absl::Status last = absl::UnavailableError("no attention worker");
  const absl::Span<const int32_t> prompt =
      affinity_prompt.empty() ? absl::Span<const int32_t>(request.prompt_token_ids().data(),
                                                          request.prompt_token_ids_size())
                              : affinity_prompt;
  for (size_t index : Order(prompt)) {
    Worker& worker = *workers_[index];
    std::unique_ptr<GenerateCall> call(new GenerateCall());
    worker.load->fetch_add(1);
    call->load_ = worker.load;
    call->worker_ = static_cast<int>(index);
    AddBearer(auth_token_, &call->context_);
    if (!traceparent.empty()) call->context_.AddMetadata("traceparent", traceparent);
    call->reader_ = worker.stub->Generate(&call->context_, request);
    if (call->reader_->Read(&call->first_)) {
      call->has_first_ = true;
      worker.down_until_ns.store(0);
      affinity_.Record(prompt, static_cast<int>(index));
      return call;
    }
    absl::Status status = call->Finish();
    if (status.ok()) {
      return absl::InternalError(
          absl::StrCat("the Generate stream from ", worker.address, " ended without a message"));
    }
    if (!absl::IsUnavailable(status)) return status;
    worker.down_until_ns.store(absl::ToUnixNanos(absl::Now() + kDownFor));
    affinity_.Forget(static_cast<int>(index));  // a restarted worker's cache is empty
    last = absl::UnavailableError(
        absl::StrCat("attention worker ", worker.address, ": ", status.message()));
  }
  return last;
}

absl::Status WorkerPool::Ping(absl::Duration timeout) {
  absl::Status last = absl::UnavailableError("no attention worker");
  for (const auto& worker : workers_) {
    absl::StatusOr<bool> serving = CheckServing(worker->channel, "k3serve.v1.K3Serve", timeout);
    if (serving.ok() && *serving) return absl::OkStatus();
    last = absl::UnavailableError(absl::StrCat(
        "attention worker ", worker->address, ": ",
        serving.ok() ? "not ready (cluster not ready, no router, or draining)"
                     : serving.status().message()));
  }
  return last;
}

}  // namespace k3
