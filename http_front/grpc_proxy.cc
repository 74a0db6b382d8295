#include "http_front/grpc_proxy.h"

#include <algorithm>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cluster/grpc_status.h"
#include "cluster/security.h"
#include "base/trace_context.h"
#include "tokenizer/chat_template.h"

namespace k3 {

namespace v1 = k3serve::v1;

namespace {

// How long a forwarded unary call (Abort, GetModelInfo, GetServerInfo) may take.
constexpr absl::Duration kUnaryTimeout = absl::Seconds(10);

std::string Metadata(const grpc::CallbackServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

// One forwarded Generate stream. Its thread starts the worker's call, then moves each message
// from the worker to the client, one write in flight at a time, and finishes the call with the
// worker's status. gRPC's threads report writes done and cancellation; OnDone joins the thread
// (which does nothing after Finish) and deletes the reactor.
class K3ServeProxy::ProxiedGenerate final
    : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  ProxiedGenerate(K3ServeProxy* proxy, v1::GenerateRequest request, std::string traceparent)
      : proxy_(proxy), request_(std::move(request)), traceparent_(std::move(traceparent)) {
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    write_ok_ = ok;
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (call_ != nullptr) call_->Cancel();
  }
  void OnDone() override {
    thread_.join();
    delete this;
  }

 private:
  void Run() {
    const std::vector<int32_t> affinity = proxy_->AffinityPrompt(request_);
    absl::StatusOr<std::unique_ptr<GenerateCall>> started =
        proxy_->pool_->Start(request_, traceparent_, affinity);
    if (!started.ok()) {
      Finish(ToGrpcStatus(started.status()));
      return;
    }
    proxy_->Track(request_.request_id(), (*started)->worker());
    {
      absl::MutexLock lock(&mu_);
      call_ = started->get();
      if (cancelled_) call_->Cancel();
    }
    GenerateCall& call = **started;
    v1::GenerateResponse response;
    bool client_gone = false;
    int worker = call.worker();
    while (!client_gone && call.Next(&response)) {
      if (call.worker() != worker) {  // resumed on another worker: Abort goes there now
        worker = call.worker();
        proxy_->Track(request_.request_id(), worker);
      }
      {
        absl::MutexLock lock(&mu_);
        writing_ = true;
      }
      StartWrite(&response);  // `response` stays put until OnWriteDone
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(+[](bool* writing) { return !*writing; }, &writing_));
      client_gone = !write_ok_;
    }
    if (client_gone) call.Cancel();  // the worker frees the request
    absl::Status status = call.Finish();
    if (client_gone && status.ok()) status = absl::CancelledError("the client went away");
    proxy_->Untrack(request_.request_id());
    {
      absl::MutexLock lock(&mu_);
      call_ = nullptr;
    }
    started->reset();  // the worker's call ends before the client's does
    Finish(ToGrpcStatus(status));
  }

  K3ServeProxy* const proxy_;
  const v1::GenerateRequest request_;
  const std::string traceparent_;
  std::thread thread_;

  absl::Mutex mu_;
  GenerateCall* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // while Run holds it
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
};

K3ServeProxy::K3ServeProxy(WorkerPool* pool, const Tokenizer* tokenizer, std::string auth_token)
    : pool_(pool),
      tokenizer_(tokenizer),
      auth_token_(std::move(auth_token)),
      id_prefix_(std::random_device()() * uint64_t{0x100000000} + std::random_device()()) {}

absl::Status K3ServeProxy::Authorize(const grpc::CallbackServerContext& context) const {
  return CheckBearer(auth_token_, Metadata(context, kAuthorizationMetadata));
}

std::vector<int32_t> K3ServeProxy::AffinityPrompt(const v1::GenerateRequest& request) const {
  if (request.prompt_token_ids_size() > 0 || tokenizer_ == nullptr) return {};
  if (!request.prompt_text().empty()) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(request.prompt_text());
    return ids.ok() ? *std::move(ids) : std::vector<int32_t>();
  }
  if (request.messages_size() == 0) return {};
  std::vector<ChatMessage> messages;
  for (const v1::ChatMessage& m : request.messages()) {
    messages.push_back({.role = m.role(), .content = m.content()});
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      RenderChat(*tokenizer_, messages, {.thinking = request.thinking()});
  return ids.ok() ? *std::move(ids) : std::vector<int32_t>();
}

std::string K3ServeProxy::NewRequestId() {
  absl::MutexLock lock(&mu_);
  return absl::StrFormat("front-%016x-%d", id_prefix_, next_id_++);
}

void K3ServeProxy::Track(const std::string& request_id, int worker) {
  absl::MutexLock lock(&mu_);
  serving_[request_id] = worker;
}

void K3ServeProxy::Untrack(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  serving_.erase(request_id);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* K3ServeProxy::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  if (absl::Status s = Authorize(*context); !s.ok()) {
    class Rejected final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
     public:
      explicit Rejected(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
      void OnDone() override { delete this; }
    };
    return new Rejected(s);
  }
  v1::GenerateRequest forwarded = *request;
  if (forwarded.request_id().empty()) forwarded.set_request_id(NewRequestId());
  if (forwarded.messages_size() > 0 && tokenizer_ != nullptr) {
    // The worker ends a chat's answer at the turn's end by itself; said explicitly, the rule
    // survives a resumption, which sends the rendered messages as token ids (GenerateCall).
    if (absl::StatusOr<int32_t> turn_end = TurnEndId(*tokenizer_); turn_end.ok()) {
      const auto& stops = forwarded.sampling().stop_token_ids();
      if (std::find(stops.begin(), stops.end(), *turn_end) == stops.end()) {
        forwarded.mutable_sampling()->add_stop_token_ids(*turn_end);
      }
    }
  }
  return new ProxiedGenerate(this, std::move(forwarded), Metadata(*context, kTraceparentHeader));
}

grpc::ServerUnaryReactor* K3ServeProxy::Forward(grpc::CallbackServerContext* context, int worker,
                                                const Send& send) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto client = std::make_shared<grpc::ClientContext>();
  client->set_deadline(absl::ToChronoTime(absl::Now() + kUnaryTimeout));
  pool_->AddAuth(client.get());
  // The callback holds the client context until the worker's answer is in.
  send(pool_->stub(worker)->async(), client.get(),
       [reactor, client](grpc::Status status) { reactor->Finish(status); });
  return reactor;
}

grpc::ServerUnaryReactor* K3ServeProxy::Finished(grpc::CallbackServerContext* context,
                                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* K3ServeProxy::Abort(grpc::CallbackServerContext* context,
                                              const v1::AbortRequest* request,
                                              v1::AbortResponse* response) {
  if (absl::Status s = Authorize(*context); !s.ok()) return Finished(context, s);
  int worker = -1;
  {
    absl::MutexLock lock(&mu_);
    auto it = serving_.find(request->request_id());
    if (it != serving_.end()) worker = it->second;
  }
  if (worker < 0) {
    response->set_found(false);
    return Finished(context, absl::OkStatus());
  }
  return Forward(context, worker, [&](Async* async, grpc::ClientContext* client, Done done) {
    async->Abort(client, request, response, std::move(done));
  });
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* K3ServeProxy::ForwardToAnyWorker(
    grpc::CallbackServerContext* context, const Request* request, Response* response,
    void (Async::*method)(grpc::ClientContext*, const Request*, Response*, Done)) {
  if (absl::Status s = Authorize(*context); !s.ok()) return Finished(context, s);
  const int worker = pool_->LeastLoaded();
  if (worker < 0) return Finished(context, absl::UnavailableError("no attention worker"));
  return Forward(context, worker,
                 [&](Async* async, grpc::ClientContext* client, Done done) {
                   (async->*method)(client, request, response, std::move(done));
                 });
}

grpc::ServerUnaryReactor* K3ServeProxy::GetModelInfo(grpc::CallbackServerContext* context,
                                                     const v1::GetModelInfoRequest* request,
                                                     v1::ModelInfo* response) {
  return ForwardToAnyWorker(context, request, response, &Async::GetModelInfo);
}

grpc::ServerUnaryReactor* K3ServeProxy::GetServerInfo(grpc::CallbackServerContext* context,
                                                      const v1::GetServerInfoRequest* request,
                                                      v1::ServerInfo* response) {
  return ForwardToAnyWorker(context, request, response, &Async::GetServerInfo);
}

}  // namespace k3
