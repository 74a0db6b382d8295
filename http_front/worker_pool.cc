#include "http_front/worker_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
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
                       std::string auth_token, WorkerPoolResolver resolver)
    : tls_(tls), auth_token_(std::move(auth_token)), resolver_(std::move(resolver)) {
  for (const std::string& address : addresses) {
    constexpr absl::string_view kDns = "dns:///";
    const size_t colon = address.rfind(':');
    int port = 0;
    if (absl::StartsWith(address, kDns) && colon != std::string::npos && colon > kDns.size() &&
        absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 && port < 65536) {
      Name name;
      name.target = address;
      name.host = address.substr(kDns.size(), colon - kDns.size());
      name.port = port;
      names_.push_back(std::move(name));
      continue;
    }
    // Anything else is one worker; if its name resolves to several, gRPC spreads its calls.
    grpc::ChannelArguments arguments;
    arguments.SetLoadBalancingPolicyName("round_robin");
    absl::MutexLock lock(&mu_);
    auto worker = std::make_unique<Worker>();
    worker->address = address;
    worker->channel = tls_.Connect(address, arguments);
    worker->stub = v1::K3Serve::NewStub(worker->channel);
    workers_.push_back(std::move(worker));
  }
  for (Name& name : names_) Refresh(name);
  if (!names_.empty()) refresher_ = std::thread([this] { RefreshLoop(); });
}

WorkerPool::WorkerPool(std::string name, std::shared_ptr<grpc::Channel> channel,
                       std::string auth_token)
    : auth_token_(std::move(auth_token)) {
  auto worker = std::make_unique<Worker>();
  worker->address = std::move(name);
  worker->channel = std::move(channel);
  worker->stub = v1::K3Serve::NewStub(worker->channel);
  absl::MutexLock lock(&mu_);
  workers_.push_back(std::move(worker));
}

WorkerPool::~WorkerPool() {
  stop_.Notify();
  if (refresher_.joinable()) refresher_.join();
}

void WorkerPool::RefreshLoop() {
  while (!stop_.WaitForNotificationWithTimeout(resolver_.interval)) {
    for (Name& name : names_) Refresh(name);
  }
}

WorkerPool::Worker* WorkerPool::Add(const std::string& address, const std::string& expected_name) {
  auto worker = std::make_unique<Worker>();
  worker->address = address;
  worker->channel = tls_.Connect(address, grpc::ChannelArguments(), expected_name);
  worker->stub = v1::K3Serve::NewStub(worker->channel);
  workers_.push_back(std::move(worker));
  return workers_.back().get();
}

void WorkerPool::Refresh(Name& name) {
  absl::StatusOr<std::vector<std::string>> resolved =
      resolver_.resolve ? resolver_.resolve(name.host, name.port)
                        : ResolveHost(name.host, name.port);
  if (!resolved.ok() || resolved->empty()) {
    LOG(WARNING) << name.target << " resolves to no worker ("
                 << (resolved.ok() ? "no address" : resolved.status().ToString())
                 << "); keeping its " << name.workers.size() << " known address(es)";
    return;
  }
  const std::set<std::string> now(resolved->begin(), resolved->end());
  absl::MutexLock lock(&mu_);
  for (const auto& [address, index] : name.workers) {
    Worker& worker = *workers_[index];
    const bool gone = now.count(address) == 0;
    if (worker.gone.exchange(gone) != gone) {
      LOG(INFO) << name.target << (gone ? " no longer resolves to " : " resolves again to ")
                << address;
      if (!gone) worker.down_until_ns.store(0);
    }
  }
  for (const std::string& address : *resolved) {  // new ones get indices in the resolver's order
    if (name.workers.count(address) > 0) continue;
    name.workers[address] = workers_.size();
    Add(address, name.host);
    LOG(INFO) << name.target << " resolves to " << address << " (worker " << workers_.size() - 1
              << ")";
  }
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  std::set<std::string> addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
      addresses.insert(absl::StrCat(text, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      addresses.insert(absl::StrCat("[", text, "]:", port));
    }
  }
  freeaddrinfo(found);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

WorkerPool::Worker* WorkerPool::worker(size_t index) const {
  absl::MutexLock lock(&mu_);
  return workers_[index].get();
}

v1::K3Serve::Stub* WorkerPool::stub(int index) const { return worker(index)->stub.get(); }

size_t WorkerPool::size() const {
  absl::MutexLock lock(&mu_);
  return workers_.size();
}

int WorkerPool::LeastLoaded() {
  const std::vector<size_t> order = Order({});
  return order.empty() ? -1 : static_cast<int>(order.front());
}

std::vector<size_t> WorkerPool::Order(absl::Span<const int32_t> prompt) {
  std::vector<const Worker*> workers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& w : workers_) workers.push_back(w.get());
  }
  const size_t n = workers.size();
  std::vector<size_t> order;
  if (n == 0) return order;
  const size_t start = next_.fetch_add(1) % n;
  const int64_t now = absl::ToUnixNanos(absl::Now());
  for (size_t i = 0; i < n; ++i) {
    if (!workers[(start + i) % n]->gone.load()) order.push_back((start + i) % n);
  }
  auto key = [&](size_t i) {
    const Worker& w = *workers[i];
    return std::make_pair(w.down_until_ns.load() > now, w.load->load());
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const std::optional<std::pair<int, int64_t>> hint = affinity_.Lookup(prompt);
  if (hint.has_value() && !order.empty()) {
    const auto preferred = std::find(order.begin(), order.end(), static_cast<size_t>(hint->first));
    if (preferred != order.end()) {
      const auto [down, load] = key(*preferred);
      if (!down && load <= key(order.front()).second + kAffinitySlack) {
        const size_t index = *preferred;
        order.erase(preferred);
        order.insert(order.begin(), index);
      }
    }
  }
  return order;
}

std::vector<int> WorkerPool::Loads() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> loads;
  for (const auto& worker : workers_) loads.push_back(worker->load->load());
  return loads;
}

std::vector<std::string> WorkerPool::Addresses() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> addresses;
  for (const auto& worker : workers_) {
    addresses.push_back(worker->gone.load() ? "" : worker->address);
  }
  return addresses;
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
  if (!names_.empty() && size() == 0) {
    last = absl::UnavailableError(absl::StrCat("no attention worker: ", names_.front().target,
                                               " has resolved to no address"));
  }
  for (size_t index : Order(prompt)) {
    Worker& worker = *this->worker(index);
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
  std::vector<Worker*> workers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& w : workers_) {
      if (!w->gone.load()) workers.push_back(w.get());
    }
  }
  for (Worker* worker : workers) {
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
