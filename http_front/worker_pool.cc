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
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "cluster/grpc_server.h"
#include "cluster/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace k3 {

namespace v1 = k3serve::v1;

namespace {

// The back-off between passes over workers that are all UNAVAILABLE.
constexpr absl::Duration kFirstBackOff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackOff = absl::Seconds(1);

// The workers' channels: gRPC's default reconnect back-off grows to two minutes, and a request
// that waits for its restarted worker (resume_timeout) must find it within a second.
grpc::ChannelArguments WorkerChannelArguments() {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return arguments;
}

// How a worker's broken stream reads in the project's words (gRPC's own text goes to the log).
std::string Lost(const std::string& address) {
  return absl::StrCat("attention worker ", address,
                      " is unreachable or not serving (stopped, restarting or draining)");
}

}  // namespace

GenerateCall::Stream::~Stream() {
  if (load != nullptr) load->fetch_sub(1);
  if (reader == nullptr || finished) return;
  context.TryCancel();
  reader->Finish();
}

absl::Status GenerateCall::Stream::Finish() {
  finished = true;
  if (load != nullptr) load->fetch_sub(1);
  load = nullptr;
  return FromGrpcStatus(reader->Finish());
}

GenerateCall::~GenerateCall() {
  std::unique_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
}

bool GenerateCall::cancelled() {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void GenerateCall::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (stream_ != nullptr) stream_->context.TryCancel();
}

void GenerateCall::Account(v1::GenerateResponse* response) {
  if (response->has_chunk()) {
    v1::TokenChunk& chunk = *response->mutable_chunk();
    if (prompt_tokens_ < 0) prompt_tokens_ = chunk.prompt_tokens();
    sent_.insert(sent_.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    if (resumes_ > 0) {
      chunk.set_prompt_tokens(prompt_tokens_);
      chunk.set_generated_tokens(chunk.generated_tokens() + base_);
    }
  } else if (response->has_complete()) {
    complete_ = true;
    v1::Usage& usage = *response->mutable_complete()->mutable_usage();
    if (resumes_ > 0) {
      usage.set_prompt_tokens(prompt_tokens_ >= 0 ? prompt_tokens_ : usage.prompt_tokens());
      usage.set_generated_tokens(usage.generated_tokens() + base_);
    }
  }
}

bool GenerateCall::Next(v1::GenerateResponse* response) {
  while (true) {
    if (has_first_) {
      has_first_ = false;
      *response = std::move(first_);
      Account(response);
      return true;
    }
    if (ended_) return false;
    Stream* stream;
    {
      absl::MutexLock lock(&mu_);
      stream = stream_.get();
    }
    if (stream == nullptr) {  // the Complete made up by Resume was handed out
      ended_ = true;
      return false;
    }
    if (stream->reader->Read(response)) {
      Account(response);
      return true;
    }
    const absl::Status status = stream->Finish();
    if (status.ok() || complete_) {
      final_ = status;
      ended_ = true;
      return false;
    }
    final_ = Resume(status);
    if (!final_.ok()) {
      ended_ = true;
      return false;
    }
  }
}

absl::Status GenerateCall::Resume(const absl::Status& status) {
  const std::string address = pool_->worker(static_cast<size_t>(worker_.load()))->address;
  const std::string id = request_.request_id();
  if (cancelled()) return status;  // this side cancelled it
  if (!absl::IsUnavailable(status) && !absl::IsCancelled(status)) return status;
  LOG(WARNING) << "request " << id << ": the stream from attention worker " << address
               << " broke after " << sent_.size() << " tokens: " << status;
  const std::string lost =
      absl::StrCat("request ", id, ": ", Lost(address), " after ", sent_.size(), " tokens");
  if (request_.sampling().constraint().alternatives_size() > 0) {
    return absl::UnavailableError(absl::StrCat(
        lost, "; a request with an output constraint cannot be resumed on another worker"));
  }
  if (prompt_.empty()) {
    return absl::UnavailableError(absl::StrCat(lost, "; its prompt ids are unknown"));
  }
  const v1::SamplingParams& sampling = request_.sampling();
  const int left = sampling.has_max_new_tokens()
                       ? sampling.max_new_tokens() - static_cast<int>(sent_.size())
                       : 1;
  const bool stopped =
      !sent_.empty() && std::find(sampling.stop_token_ids().begin(),
                                  sampling.stop_token_ids().end(),
                                  sent_.back()) != sampling.stop_token_ids().end();
  if (left <= 0 || stopped) {
    // Every token was handed out; only the Complete was lost.
    v1::Complete& complete = *first_.mutable_complete();
    first_.set_request_id(id);
    complete.set_finish_reason(stopped ? v1::Complete::STOP : v1::Complete::LENGTH);
    complete.mutable_usage()->set_prompt_tokens(std::max(prompt_tokens_, 0));
    complete.mutable_usage()->set_generated_tokens(static_cast<int>(sent_.size()));
    base_ = 0;  // the counts above are already the original stream's
    has_first_ = true;
    absl::MutexLock lock(&mu_);
    stream_.reset();
    return absl::OkStatus();
  }
  v1::GenerateRequest again = request_;
  again.clear_prompt_text();
  again.clear_messages();
  again.clear_prompt_token_ids();
  again.mutable_prompt_token_ids()->Add(prompt_.begin(), prompt_.end());
  again.mutable_prompt_token_ids()->Add(sent_.begin(), sent_.end());
  if (sampling.has_max_new_tokens()) again.mutable_sampling()->set_max_new_tokens(left);
  const absl::Time deadline = absl::Now() + pool_->resume_timeout_;
  absl::StatusOr<std::unique_ptr<Stream>> opened =
      pool_->OpenWaiting(again, traceparent_, prompt_, &first_, deadline, this);
  if (!opened.ok() && cancelled()) return status;  // e.g. the front stops: the worker's reason
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat(lost, "; it could not be resumed within ",
                                     absl::FormatDuration(pool_->resume_timeout_), ": ",
                                     opened.status().message()));
  }
  absl::MutexLock lock(&mu_);
  if (cancelled_) (*opened)->context.TryCancel();
  stream_ = *std::move(opened);
  worker_.store(stream_->worker);
  base_ = static_cast<int>(sent_.size());
  ++resumes_;
  has_first_ = true;
  LOG(WARNING) << "request " << id << " resumed on attention worker "
               << pool_->worker(static_cast<size_t>(stream_->worker))->address << " after "
               << base_ << " tokens";
  return absl::OkStatus();
}

absl::Status GenerateCall::Finish() {
  if (!ended_) {
    // Next has not returned false (e.g. the client went away): end the stream as it is.
    ended_ = true;
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && !stream_->finished) final_ = stream_->Finish();
  }
  return final_;
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
    grpc::ChannelArguments arguments = WorkerChannelArguments();
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
  Stop();
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
  worker->channel = tls_.Connect(address, WorkerChannelArguments(), expected_name);
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

absl::StatusOr<std::unique_ptr<GenerateCall::Stream>> WorkerPool::Open(
    const v1::GenerateRequest& request, const std::string& traceparent,
    absl::Span<const int32_t> prompt, v1::GenerateResponse* first) {
  absl::Status last = absl::UnavailableError("no attention worker");
  if (!names_.empty() && size() == 0) {
    last = absl::UnavailableError(absl::StrCat("no attention worker: ", names_.front().target,
                                               " has resolved to no address"));
  }
  std::vector<std::string> down;
  for (size_t index : Order(prompt)) {
    Worker& worker = *this->worker(index);
    auto stream = std::make_unique<GenerateCall::Stream>();
    worker.load->fetch_add(1);
    stream->load = worker.load;
    stream->worker = static_cast<int>(index);
    AddBearer(auth_token_, &stream->context);
    if (!traceparent.empty()) stream->context.AddMetadata("traceparent", traceparent);
    stream->reader = worker.stub->Generate(&stream->context, request);
    if (stream->reader->Read(first)) {
      worker.down_until_ns.store(0);
      affinity_.Record(prompt, static_cast<int>(index));
      return stream;
    }
    absl::Status status = stream->Finish();
    if (status.ok()) {
      return absl::InternalError(
          absl::StrCat("the Generate stream from ", worker.address, " ended without a message"));
    }
    if (!absl::IsUnavailable(status)) return status;
    worker.down_until_ns.store(absl::ToUnixNanos(absl::Now() + kDownFor));
    affinity_.Forget(static_cast<int>(index));  // a restarted worker's cache is empty
    VLOG(1) << "attention worker " << worker.address << ": " << status;
    down.push_back(worker.address);
    last = absl::UnavailableError(
        absl::StrCat(down.size() == 1 ? Lost(down[0])
                                      : absl::StrCat("attention workers ", absl::StrJoin(down, ", "),
                                                     " are unreachable or not serving")));
  }
  return last;
}

absl::StatusOr<std::unique_ptr<GenerateCall::Stream>> WorkerPool::OpenWaiting(
    const v1::GenerateRequest& request, const std::string& traceparent,
    absl::Span<const int32_t> prompt, v1::GenerateResponse* first, absl::Time deadline,
    GenerateCall* call) {
  absl::Duration back_off = kFirstBackOff;
  const absl::Time start = absl::Now();
  for (int pass = 0;; ++pass) {
    if (call != nullptr && call->cancelled()) {
      return absl::CancelledError("the call was cancelled while it waited for a worker");
    }
    absl::StatusOr<std::unique_ptr<GenerateCall::Stream>> stream =
        Open(request, traceparent, prompt, first);
    if (stream.ok() && pass > 0) {
      LOG(WARNING) << "request " << request.request_id() << " started on attention worker "
                   << worker((*stream)->worker)->address << " after waiting "
                   << absl::FormatDuration(absl::Now() - start) << " for a worker";
    }
    if (stream.ok() || !absl::IsUnavailable(stream.status())) return stream;
    const absl::Time now = absl::Now();
    if (now >= deadline) return stream.status();
    // A back-off on the request's own thread, cut short when the front stops.
    if (stop_.WaitForNotificationWithTimeout(std::min(back_off, deadline - now))) {
      return absl::UnavailableError("the front is shutting down");
    }
    back_off = std::min(kMaxBackOff, 2 * back_off);
  }
}

absl::StatusOr<std::unique_ptr<GenerateCall>> WorkerPool::Start(
    const v1::GenerateRequest& request, const std::string& traceparent,
    absl::Span<const int32_t> affinity_prompt) {
  const absl::Span<const int32_t> prompt =
      affinity_prompt.empty() ? absl::Span<const int32_t>(request.prompt_token_ids().data(),
                                                          request.prompt_token_ids_size())
                              : affinity_prompt;
  std::unique_ptr<GenerateCall> call(new GenerateCall());
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GenerateCall::Stream> stream,
                      OpenWaiting(request, traceparent, prompt, &call->first_,
                                  absl::Now() + resume_timeout_));
  call->pool_ = this;
  call->request_ = request;
  call->traceparent_ = traceparent;
  call->prompt_.assign(prompt.begin(), prompt.end());
  call->worker_.store(stream->worker);
  call->has_first_ = true;
  absl::MutexLock lock(&call->mu_);
  call->stream_ = std::move(stream);
  return call;
}

void WorkerPool::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (!stop_.HasBeenNotified()) stop_.Notify();
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
