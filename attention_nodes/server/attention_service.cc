#include "attention_nodes/server/attention_service.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "cluster/grpc_status.h"
#include "cluster/metrics.h"
#include "cluster/security.h"
#include "base/trace_context.h"
#include "glog/logging.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.grpc.pb.h"
#include "proto/generate.grpc.pb.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/json_grammar.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/token_constraint.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;
namespace cpb = k3serve::cluster::v1;

// Generate streams in flight per client address (K3ServeLimits::max_streams_per_client).
class StreamCounts {
 public:
  explicit StreamCounts(int limit) : limit_(limit) {}

  // A stream of `client` while the returned object lives; null when the client has `limit` of
  // them already.
  std::unique_ptr<void, std::function<void(void*)>> Acquire(const std::string& client) {
    absl::MutexLock lock(&mu_);
    int& count = counts_[client];
    if (limit_ > 0 && count >= limit_) return nullptr;
    ++count;
    // Any non-null pointer: the deleter only needs `client`.
    return std::unique_ptr<void, std::function<void(void*)>>(this, [this, client](void*) {
      absl::MutexLock lock(&mu_);
      if (--counts_[client] == 0) counts_.erase(client);
    });
  }

  int limit() const { return limit_; }

 private:
  const int limit_;
  absl::Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
};

// The call's "authorization" metadata ("" when absent).
std::string Authorization(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// The call's sampled W3C trace context; none when absent, malformed (the spec: start no trace)
// or not sampled.
std::optional<TraceContext> SampledTrace(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTraceparentHeader);
  if (it == metadata.end()) return std::nullopt;
  absl::StatusOr<TraceContext> trace =
      ParseTraceparent(std::string_view(it->second.data(), it->second.size()));
  if (!trace.ok() || !trace->sampled()) return std::nullopt;
  return *trace;
}

// The call's reactor, finished with `status`: the answer of a unary call that needs no waiting.
grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

v1::Complete::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::Complete::LENGTH;
    case FinishReason::kStop:
      return v1::Complete::STOP;
    case FinishReason::kCancelled:
      return v1::Complete::CANCELLED;
    case FinishReason::kError:
      return v1::Complete::ERROR;
  }
  return v1::Complete::FINISH_REASON_UNSPECIFIED;
}

GenerationRequest FromProto(const v1::GenerateRequest& proto, int max_new_tokens_limit) {
  GenerationRequest request;
  request.id = proto.request_id();
  request.prompt.assign(proto.prompt_token_ids().begin(), proto.prompt_token_ids().end());
  const v1::SamplingParams& sampling = proto.sampling();
  if (sampling.has_temperature()) request.sampling.temperature = sampling.temperature();
  if (sampling.has_top_p()) request.sampling.top_p = sampling.top_p();
  if (sampling.has_top_k()) request.sampling.top_k = sampling.top_k();
  request.sampling.seed = sampling.has_seed() ? sampling.seed() : RandomSeed();
  if (!sampling.has_max_new_tokens()) {
    request.max_new_tokens = std::min(kDefaultMaxNewTokens, max_new_tokens_limit);
  } else {  // 0: as many as the server allows
    request.max_new_tokens =
        sampling.max_new_tokens() == 0 ? max_new_tokens_limit : sampling.max_new_tokens();
  }
  // Negative: none (the scheduler's -1); beyond the limit: the scheduler's INVALID_ARGUMENT.
  if (sampling.has_top_logprobs()) request.top_logprobs = std::max(sampling.top_logprobs(), -1);
  request.stop_token_ids.assign(sampling.stop_token_ids().begin(),
                                sampling.stop_token_ids().end());
  request.ignore_eos = sampling.ignore_eos();
  return request;
}

// The shape of a SamplingParams.constraint; InvalidArgument for an empty one or a bad schema.
absl::StatusOr<std::shared_ptr<const ConstraintShape>> ConstraintShapeFromProto(
    const v1::OutputConstraint& proto) {
  auto shape = std::make_shared<ConstraintShape>();
  for (const v1::ConstraintAlternative& alternative : proto.alternatives()) {
    std::vector<ConstraintPiece>& pieces = shape->emplace_back();
    for (const v1::ConstraintPiece& piece : alternative.pieces()) {
      using Kind = ConstraintPiece::Kind;
      switch (piece.kind_case()) {
        case v1::ConstraintPiece::kTokenId:
          pieces.push_back({.kind = Kind::kToken, .token = piece.token_id()});
          break;
        case v1::ConstraintPiece::kFreeUntilTokenId:
          pieces.push_back({.kind = Kind::kFreeUntil,
                            .token = piece.free_until_token_id(),
                            .max_free_tokens = piece.has_max_free_tokens()
                                                   ? std::max(0, piece.max_free_tokens())
                                                   : -1});
          break;
        case v1::ConstraintPiece::kText:
          if (!piece.text().empty()) pieces.push_back({.kind = Kind::kText, .text = piece.text()});
          break;
        case v1::ConstraintPiece::kJsonSchema: {
          const auto schema = nlohmann::ordered_json::parse(piece.json_schema(), nullptr, false);
          if (schema.is_discarded()) {
            return absl::InvalidArgumentError("a constraint's json_schema is not JSON");
          }
          K3_ASSIGN_OR_RETURN(std::shared_ptr<const JsonGrammar> grammar,
                              JsonGrammar::FromSchema(schema));
          pieces.push_back({.kind = Kind::kJson, .json = std::move(grammar)});
          break;
        }
        default:
          return absl::InvalidArgumentError("a constraint piece has no kind");
      }
    }
    if (pieces.empty()) return absl::InvalidArgumentError("a constraint alternative is empty");
  }
  if (shape->empty()) return absl::InvalidArgumentError("a constraint has no alternatives");
  return shape;
}

class GenerateReactor;

// One Generate stream's outbox, shared by the scheduler (which fills it through the sink
// interface) and the reactor (which drains it). gRPC allows one write in flight at a time, so
// messages queue here; Finish is called once, after the last write completed. Neither StartWrite
// nor Finish is called under mu_: gRPC may run reactions inline.
class GenerateStream final : public GenerationSink {
 public:
  // `tokenizer` (may be null: no text) must outlive the stream. `silent_ids` (the stop tokens
  // and eos) end the answer and add nothing to its text.
  // `calls` (may be null) counts the call's final status by code.
  GenerateStream(GenerateReactor* reactor, std::string request_id, const Tokenizer* tokenizer,
                 std::vector<int32_t> silent_ids, MetricFamily<Counter>* calls)
      : reactor_(reactor),
        request_id_(std::move(request_id)),
        silent_ids_(std::move(silent_ids)),
        calls_(calls) {
    if (tokenizer != nullptr) decoder_.emplace(*tokenizer);
  }

  void set_handle(std::shared_ptr<RequestHandle> handle) {
    absl::MutexLock lock(&mu_);
    handle_ = std::move(handle);
  }

  void OnLogprobs(const TokenLogprobs& logprobs) override { logprobs_ = logprobs; }

  void OnToken(int32_t token, int prompt_tokens, int generated_tokens) override {
    v1::GenerateResponse message = FirstOrNext();
    v1::TokenChunk* chunk = message.mutable_chunk();
    chunk->add_token_ids(token);
    if (logprobs_.has_value()) {
      v1::TokenLogprobs* entry = chunk->add_logprobs();
      entry->set_logprob(logprobs_->logprob);
      for (const auto& [id, logprob] : logprobs_->top) {
        v1::TopLogprob* top = entry->add_top();
        top->set_token_id(id);
        top->set_logprob(logprob);
      }
      logprobs_.reset();
    }
    chunk->set_prompt_tokens(prompt_tokens);
    chunk->set_generated_tokens(generated_tokens);
    if (decoder_.has_value() &&
        std::find(silent_ids_.begin(), silent_ids_.end(), token) == silent_ids_.end()) {
      // An id the tokenizer does not know (a model vocabulary larger than the tokenizer's) shows
      // as U+FFFD rather than vanishing from the text.
      absl::StatusOr<std::string> text = decoder_->Push(token);
      chunk->set_text(text.ok() ? *std::move(text) : std::string(kReplacementCharacter));
    }
    Push(std::move(message), std::nullopt);
  }

  void OnFinish(const GenerationResult& result) override {
    v1::GenerateResponse message = FirstOrNext();
    v1::Complete* complete = message.mutable_complete();
    complete->set_finish_reason(ToProto(result.reason));
    complete->mutable_usage()->set_prompt_tokens(result.prompt_tokens);
    complete->mutable_usage()->set_generated_tokens(result.generated_tokens);
    complete->set_message(result.message);
    if (decoder_.has_value()) complete->set_text(decoder_->Finish());
    Push(std::move(message), ToGrpcStatus(result.status));
  }

  // Ends the call with `status` before any message (the request was not accepted).
  void Reject(grpc::Status status) {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      if (final_status_.has_value()) return;
      final_status_ = std::move(status);
      action = NextLocked();
    }
    Run(action);
  }

  // Reactions, forwarded by the reactor.
  void WriteDone(bool ok);
  void Cancelled();

 private:
  struct Action {
    const v1::GenerateResponse* write = nullptr;
    std::optional<grpc::Status> finish;
  };

  // A new message, naming the request if it is the stream's first (the id can be long: it is
  // sent once, not with every token). Scheduler thread only.
  v1::GenerateResponse FirstOrNext() {
    v1::GenerateResponse message;
    if (!id_sent_) message.set_request_id(request_id_);
    id_sent_ = true;
    return message;
  }
  void Push(v1::GenerateResponse message, std::optional<grpc::Status> final_status);
  // What to start next: a write, the finish, or nothing (a write is in flight).
  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const Action& action);
  void CancelRequest(const char* why);

  GenerateReactor* const reactor_;
  const std::string request_id_;
  bool id_sent_ = false;  // scheduler thread only
  const std::vector<int32_t> silent_ids_;
  MetricFamily<Counter>* const calls_;
  std::optional<StreamingDecoder> decoder_;  // the scheduler's thread only (OnToken, OnFinish)
  std::optional<TokenLogprobs> logprobs_;  // the next OnToken's, from OnLogprobs (same thread)
  absl::Mutex mu_;
  std::shared_ptr<RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);  // front is in flight if writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called: the reactor may be gone soon
};

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(const std::string& request_id, const Tokenizer* tokenizer,
                  std::vector<int32_t> silent_ids, MetricFamily<Counter>* calls)
      : stream_(std::make_shared<GenerateStream>(this, request_id, tokenizer,
                                                 std::move(silent_ids), calls)) {}

  const std::shared_ptr<GenerateStream>& stream() const { return stream_; }
  // Held until the call is done (a StreamCounts slot).
  void Hold(std::unique_ptr<void, std::function<void(void*)>> slot) { slot_ = std::move(slot); }

  void OnWriteDone(bool ok) override { stream_->WriteDone(ok); }
  void OnCancel() override { stream_->Cancelled(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<GenerateStream> stream_;
  std::unique_ptr<void, std::function<void(void*)>> slot_;
};

void GenerateStream::Push(v1::GenerateResponse message, std::optional<grpc::Status> final_status) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || final_status_.has_value()) return;
    queue_.push_back(std::move(message));
    final_status_ = std::move(final_status);
    action = NextLocked();
  }
  Run(action);
}

GenerateStream::Action GenerateStream::NextLocked() {
  Action action;
  if (writing_ || finished_) return action;
  if (!queue_.empty()) {
    writing_ = true;
    action.write = &queue_.front();  // deque elements stay put while others are added
  } else if (final_status_.has_value()) {
    finished_ = true;
    action.finish = *final_status_;
    if (calls_ != nullptr) {
      calls_
          ->WithLabels({absl::StatusCodeToString(
              static_cast<absl::StatusCode>(final_status_->error_code()))})
          ->Increment();
    }
  }
  return action;
}

void GenerateStream::Run(const Action& action) {
  if (action.write != nullptr) reactor_->StartWrite(action.write);
  if (action.finish.has_value()) reactor_->Finish(*action.finish);
}

void GenerateStream::WriteDone(bool ok) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      // The client is gone: nothing more can be written; end the call.
      queue_.clear();
      if (!final_status_.has_value()) {
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke");
      }
    }
    action = NextLocked();
  }
  if (!ok) CancelRequest("the stream to the client broke");
  Run(action);
}

void GenerateStream::Cancelled() {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    // Keep only a write in flight (its buffer must live until OnWriteDone).
    if (!queue_.empty()) queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
    if (!final_status_.has_value()) {
      final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    action = NextLocked();
  }
  CancelRequest("the client cancelled the stream");
  Run(action);
}

void GenerateStream::CancelRequest(const char* why) {
  std::shared_ptr<RequestHandle> handle;
  {
    absl::MutexLock lock(&mu_);
    handle = handle_;
  }
  if (handle != nullptr) handle->Cancel(absl::CancelledError(why), why);
}

class K3ServeService final : public v1::K3Serve::CallbackService {
 public:
  K3ServeService(GenerationScheduler* scheduler, std::shared_ptr<const Tokenizer> tokenizer,
                 MetricsRegistry* metrics, K3ServeLimits limits)
      : scheduler_(scheduler),
        auth_token_(std::move(limits.auth_token)),
        streams_(limits.max_streams_per_client),
        tokenizer_(std::move(tokenizer)),
        calls_(metrics == nullptr
                   ? nullptr
                   : &metrics->AddCounter("k3_attention_generate_calls_total",
                                          "Generate calls ended, by the gRPC status code they "
                                          "ended with (rejected ones included).",
                                          {"code"})),
        start_(absl::Now()) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override {
    if (absl::Status s = CheckBearer(auth_token_, Authorization(*context)); !s.ok()) {
      auto* reactor = new GenerateReactor(request->request_id(), nullptr, {}, calls_);
      reactor->stream()->Reject(ToGrpcStatus(s));
      return reactor;
    }
    const std::string client = PeerHost(context->peer());
    std::unique_ptr<void, std::function<void(void*)>> slot = streams_.Acquire(client);
    if (slot == nullptr) {
      auto* reactor = new GenerateReactor(request->request_id(), nullptr, {}, calls_);
      reactor->stream()->Reject(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("client ", client, " has ", streams_.limit(),
                       " Generate streams in flight already (--max-streams-per-client)"))));
      return reactor;
    }
    GenerationRequest generation = FromProto(*request, scheduler_->options().max_new_tokens_limit);
    generation.trace = SampledTrace(*context);
    absl::Status s = EncodeTextPrompt(*request, &generation);
    if (s.ok()) s = AttachConstraint(request->sampling(), &generation);
    if (!s.ok()) {
      auto* reactor = new GenerateReactor(request->request_id(), nullptr, {}, calls_);
      reactor->stream()->Reject(ToGrpcStatus(s));
      reactor->Hold(std::move(slot));
      return reactor;
    }
    // The id is fixed before Submit so that the stream can name it in every message. An id the
    // server picks could collide with one a client chose: then it picks another.
    const bool assign_id = generation.id.empty();
    std::vector<int32_t> silent_ids = generation.stop_token_ids;
    silent_ids.push_back(static_cast<int32_t>(scheduler_->config().eos_token_id));
    GenerateReactor* reactor = nullptr;
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle;
    do {
      GenerationRequest attempt = generation;
      if (assign_id) {
        absl::MutexLock lock(&mu_);
        attempt.id = absl::StrCat("srv-", next_id_++);
      }
      delete reactor;  // never started: only a rejected attempt gets here
      reactor = new GenerateReactor(attempt.id, tokenizer_.get(), silent_ids, calls_);
      handle = scheduler_->Submit(std::move(attempt), reactor->stream());
    } while (assign_id && absl::IsAlreadyExists(handle.status()));
    if (!handle.ok()) {
      VLOG(1) << "Generate from " << context->peer() << " rejected: " << handle.status();
      reactor->stream()->Reject(ToGrpcStatus(handle.status()));
      reactor->Hold(std::move(slot));
      return reactor;
    }
    reactor->Hold(std::move(slot));
    reactor->stream()->set_handle(*handle);
    // A cancellation that arrived before the handle was set found nothing to cancel.
    if (context->IsCancelled()) (*handle)->Cancel(absl::CancelledError("cancelled"), "cancelled");
    return reactor;
  }

  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override {
    if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
    response->set_found(scheduler_->Abort(request->request_id(), "aborted by an Abort call"));
    return Finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* /*request*/,
                                         v1::ModelInfo* response) override {
    if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
    const ModelConfig& config = scheduler_->config();
    response->set_model_type(config.model_type);
    response->set_vocab_size(config.vocab_size);
    response->set_num_layers(config.num_hidden_layers);
    response->set_max_new_tokens_limit(scheduler_->options().max_new_tokens_limit);
    response->set_max_prompt_tokens(scheduler_->options().max_prompt_tokens);
    response->set_eos_token_id(config.eos_token_id);
    response->set_has_tokenizer(tokenizer_ != nullptr);
    return Finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* /*request*/,
                                          v1::ServerInfo* response) override {
    if (grpc::ServerUnaryReactor* refused = Refuse(context)) return refused;
    const SchedulerInfo info = scheduler_->Info();
    response->set_active_requests(info.active_requests);
    response->set_cached_sequences(info.cached_sequences);
    response->set_request_state_bytes(info.state_bytes);
    response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_));
    response->set_draining(info.draining);
    return Finished(context, grpc::Status::OK);
  }

 private:
  // A reactor that finished the call UNAUTHENTICATED when the token is missing or wrong; null
  // when the call may go on.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context) const {
    absl::Status s = CheckBearer(auth_token_, Authorization(*context));
    if (s.ok()) return nullptr;
    return Finished(context, ToGrpcStatus(s));
  }

  // Fills generation->prompt from the request's text or messages, if it has either.
  absl::Status EncodeTextPrompt(const v1::GenerateRequest& request,
                                GenerationRequest* generation) const {
    const int forms = (request.prompt_token_ids_size() > 0) + !request.prompt_text().empty() +
                      (request.messages_size() > 0);
    if (forms > 1) {
      return absl::InvalidArgumentError(
          "give the prompt as one of prompt_token_ids, prompt_text and messages");
    }
    if (request.prompt_text().empty() && request.messages_size() == 0) return absl::OkStatus();
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError(
          "this node has no tokenizer (no tiktoken.model in its model folder): send "
          "prompt_token_ids");
    }
    if (!request.prompt_text().empty()) {
      K3_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_->Encode(request.prompt_text()));
      generation->prompt = std::move(ids);
      return absl::OkStatus();
    }
    std::vector<ChatMessage> messages;
    for (const v1::ChatMessage& m : request.messages()) {
      messages.push_back({.role = m.role(), .content = m.content()});
    }
    K3_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        RenderChat(*tokenizer_, messages, {.thinking = request.thinking()}));
    K3_ASSIGN_OR_RETURN(int32_t turn_end, TurnEndId(*tokenizer_));
    generation->prompt = std::move(ids);
    generation->stop_token_ids.push_back(turn_end);
    return absl::OkStatus();
  }

  // SamplingParams.constraint: the shape, with the vocabulary's bytes (built on first use).
  absl::Status AttachConstraint(const v1::SamplingParams& sampling, GenerationRequest* generation) {
    if (!sampling.has_constraint()) return absl::OkStatus();
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError("constrained decoding needs the node's tokenizer");
    }
    K3_ASSIGN_OR_RETURN(std::shared_ptr<const ConstraintShape> shape,
                        ConstraintShapeFromProto(sampling.constraint()));
    int shortest = INT_MAX;
    for (const std::vector<ConstraintPiece>& alternative : *shape) {
      shortest = std::min(shortest, MinTokens(alternative));
    }
    if (shortest > generation->max_new_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_new_tokens ", generation->max_new_tokens,
                       " cannot hold the constraint's shortest answer (", shortest, " tokens)"));
    }
    absl::MutexLock lock(&mu_);
    if (vocabulary_ == nullptr) {
      vocabulary_ = std::make_shared<const TokenVocabulary>(*tokenizer_,
                                                            scheduler_->config().vocab_size);
    }
    generation->sampling.vocabulary = vocabulary_;
    generation->sampling.constraint = std::move(shape);
    generation->sampling.constraint_max_tokens = generation->max_new_tokens;
    return absl::OkStatus();
  }

  GenerationScheduler* const scheduler_;
  const std::string auth_token_;  // empty: none required
  StreamCounts streams_;
  const std::shared_ptr<const Tokenizer> tokenizer_;  // null: token ids only
  MetricFamily<Counter>* const calls_;                // null: no metrics
  const absl::Time start_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<const TokenVocabulary> vocabulary_ ABSL_GUARDED_BY(mu_);
};

// Drain answers once the node is idle or its deadline passed: the handler returns at once and
// the scheduler finishes the call (no gRPC thread waits).
class AttentionControlService final : public cpb::AttentionControl::CallbackService {
 public:
  explicit AttentionControlService(AttentionDrain drain) : drain_(std::move(drain)) {}

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const cpb::DrainNodeRequest* request,
                                  cpb::DrainNodeResponse* response) override {
    if (request->deadline_ms() < 0) {
      return Finished(context,
                      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "deadline_ms must be >= 0"));
    }
    const absl::Time deadline = request->deadline_ms() == 0
                                    ? absl::InfiniteFuture()
                                    : absl::Now() + absl::Milliseconds(request->deadline_ms());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    drain_(deadline, [reactor, response](int left) {
      response->set_active_requests(left);
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

 private:
  const AttentionDrain drain_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewK3ServeService(GenerationScheduler* scheduler,
                                                 std::shared_ptr<const Tokenizer> tokenizer,
                                                 MetricsRegistry* metrics,
                                                 K3ServeLimits limits) {
  return std::make_unique<K3ServeService>(scheduler, std::move(tokenizer), metrics,
                                          std::move(limits));
}

std::string PeerHost(const std::string& peer) {
  absl::string_view rest = peer;
  if (!absl::ConsumePrefix(&rest, "ipv4:") && !absl::ConsumePrefix(&rest, "ipv6:")) return peer;
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return std::string(rest);
  absl::string_view host = rest.substr(0, colon);
  absl::ConsumePrefix(&host, "[");
  absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

std::unique_ptr<grpc::Service> NewAttentionControlService(AttentionDrain drain) {
  return std::make_unique<AttentionControlService>(std::move(drain));
}

}  // namespace k3
