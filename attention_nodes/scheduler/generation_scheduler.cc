#include "attention_nodes/scheduler/generation_scheduler.h"

#include <algorithm>
#include <iterator>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/batch_invariance.h"
#include "glog/logging.h"

namespace k3 {

const char* FinishReasonName(FinishReason reason) {
  constexpr const char* kNames[] = {"length", "stop", "cancelled", "error"};  // in enum order
  const auto index = static_cast<size_t>(reason);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

absl::Status SchedulerOptions::Validate() const {
  if (max_batch_tokens < 1) return absl::InvalidArgumentError("max_batch_tokens must be >= 1");
  if (max_sequences < 1) return absl::InvalidArgumentError("max_sequences must be >= 1");
  if (max_new_tokens_limit < 1) {
    return absl::InvalidArgumentError("max_new_tokens_limit must be >= 1");
  }
  if (max_prompt_tokens < 1) return absl::InvalidArgumentError("max_prompt_tokens must be >= 1");
  if (step_target < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("step_target must be >= 0");
  }
  if (!(step_target_factor >= 1.0)) {
    return absl::InvalidArgumentError("step_target_factor must be >= 1");
  }
  if (ttft_target <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ttft_target must be > 0");
  }
  if (min_prefill_chunk < 1) return absl::InvalidArgumentError("min_prefill_chunk must be >= 1");
  if (prefix_cache_bytes < 0) return absl::InvalidArgumentError("prefix_cache_bytes must be >= 0");
  if (prefix_cache_bytes > 0) {
    return PrefixCacheOptions{prefix_block_tokens, prefix_cache_bytes}.Validate();
  }
  return absl::OkStatus();
}

void RequestHandle::Cancel(absl::Status status, std::string message) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.load(std::memory_order_relaxed)) return;
  status_ = std::move(status);
  message_ = std::move(message);
  cancelled_.store(true, std::memory_order_release);
}

GenerationResult RequestHandle::CancelResult() const {
  absl::MutexLock lock(&mu_);
  GenerationResult result;
  result.reason = FinishReason::kCancelled;
  result.status = status_;
  result.message = message_;
  return result;
}

struct GenerationScheduler::Sequence {
  Sequence(std::shared_ptr<RequestHandle> h, std::shared_ptr<GenerationSink> s,
           GenerationRequest r)
      : handle(std::move(h)), sink(std::move(s)), request(std::move(r)), sampler(request.sampling) {
    if (request.trace.has_value()) span_id = NewSpanId();
  }

  std::shared_ptr<RequestHandle> handle;
  std::shared_ptr<GenerationSink> sink;
  GenerationRequest request;
  Sampler sampler;
  const absl::Time submitted = absl::Now();
  absl::Time last_token;  // when the last token was handed to the sink
  std::unique_ptr<SequenceState> state;  // set while admitted
  size_t consumed = 0;                   // prompt tokens fed to the model
  std::vector<int32_t> generated;
  bool finished = false;
  // Traced requests: the request's span ("k3.generate") and the current step's.
  std::array<uint8_t, 8> span_id{};
  TraceContext step_trace;  // the trace under the current step's span

  bool decoding() const { return consumed == request.prompt.size(); }
};

namespace {

// Failures that a later attempt may not meet (a lost worker, a timeout) end calls with
// UNAVAILABLE so that clients retry; anything else is a bug and says INTERNAL.
absl::Status StepFailure(const absl::Status& cause) {
  const bool transient = absl::IsUnavailable(cause) || absl::IsDeadlineExceeded(cause) ||
                         absl::IsCancelled(cause) || absl::IsAborted(cause) ||
                         absl::IsResourceExhausted(cause);
  return absl::Status(transient ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal,
                      absl::StrCat("model step failed: ", cause.message()));
}

StepBudgetOptions BudgetOptions(const SchedulerOptions& options) {
  StepBudgetOptions budget;
  budget.max_tokens = std::max<int64_t>(options.max_batch_tokens, 1);
  budget.min_prompt_tokens = std::clamp<int64_t>(options.min_prefill_chunk, 1, budget.max_tokens);
  budget.target = std::max(options.step_target, absl::ZeroDuration());
  budget.target_factor = std::max(options.step_target_factor, 1.0);
  if (options.ttft_target > absl::ZeroDuration()) budget.ttft_target = options.ttft_target;
  return budget;
}

GenerationResult ErrorResult(absl::Status status) {
  GenerationResult result;
  result.reason = FinishReason::kError;
  result.message = std::string(status.message());
  result.status = std::move(status);
  return result;
}

}  // namespace

GenerationScheduler::GenerationScheduler(const ModelWeights* weights, RoutedMoe* routed_moe,
                                         const SchedulerOptions& options, MetricsRegistry* metrics)
    : GenerationScheduler(std::make_unique<ModelRunner>(weights, routed_moe), options, metrics) {}

GenerationScheduler::GenerationScheduler(std::unique_ptr<StepRunner> runner,
                                         const SchedulerOptions& options, MetricsRegistry* metrics)
    : options_(options),
      metrics_(metrics != nullptr ? std::make_unique<SchedulerMetrics>(*metrics) : nullptr),
      runner_(std::move(runner)),
      step_budget_(BudgetOptions(options)),
      actor_("scheduler") {
  const absl::Status valid = options_.Validate();
  CHECK(valid.ok()) << valid;
  runner_->set_ping_pong(options_.ping_pong);
  if (options_.prefix_cache_bytes > 0 && !runner_->host_state()) {
    LOG(INFO) << "the prefix cache is off: this runner keeps sequence states off the host";
  } else if (options_.prefix_cache_bytes > 0) {
    prefix_cache_ = std::make_unique<PrefixCache>(
        runner_->config(),
        PrefixCacheOptions{options_.prefix_block_tokens, options_.prefix_cache_bytes});
    if (metrics != nullptr) prefix_metrics_ = std::make_unique<PrefixCacheMetrics>(*metrics);
  }
}

GenerationScheduler::~GenerationScheduler() { Shutdown(); }

absl::Status GenerationScheduler::Validate(const GenerationRequest& request) const {
  const int64_t vocab = config().vocab_size;
  if (request.id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id has ", request.id.size(),
                                                   " bytes; at most ", kMaxRequestIdBytes,
                                                   " are accepted"));
  }
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
  if (request.prompt.size() > static_cast<size_t>(options_.max_prompt_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", request.prompt.size(),
                                                   " tokens; this server takes at most ",
                                                   options_.max_prompt_tokens));
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " has id ",
                                                     request.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (int32_t stop : request.stop_token_ids) {
    if (stop < 0 || stop >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop token id ", stop, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (request.max_new_tokens < 1 || request.max_new_tokens > options_.max_new_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens is ", request.max_new_tokens,
                                                   "; it must lie in [1, ",
                                                   options_.max_new_tokens_limit, "]"));
  }
  if (request.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("top_logprobs is ", request.top_logprobs,
                                                   "; at most ", kMaxTopLogprobs));
  }
  return ValidateSamplingOptions(request.sampling);
}

absl::StatusOr<std::shared_ptr<RequestHandle>> GenerationScheduler::Submit(
    GenerationRequest request, std::shared_ptr<GenerationSink> sink) {
  if (absl::Status s = Validate(request); !s.ok()) {
    if (metrics_) metrics_->rejected->Increment();
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (!admitting_) {
    return absl::UnavailableError(shut_down_ ? "the server is shutting down"
                                             : "the server is draining");
  }
  if (request.id.empty()) {
    do {
      request.id = absl::StrCat("req-", next_id_++);
    } while (in_flight_.count(request.id) > 0);
  } else if (in_flight_.count(request.id) > 0) {
    if (metrics_) metrics_->rejected->Increment();
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", request.id, "' is already in flight"));
  }
  auto handle = std::make_shared<RequestHandle>(request.id);
  in_flight_.emplace(request.id, handle);
  if (metrics_) metrics_->active->Set(static_cast<double>(in_flight_.size()));
  auto sequence = std::make_shared<Sequence>(handle, std::move(sink), std::move(request));
  // Posted under mu_: Shutdown's final sweep, posted under mu_ too, then runs after this.
  if (!actor_.Post([this, sequence] { Admit(sequence); })) {
    in_flight_.erase(handle->id());
    return absl::UnavailableError("the server is shutting down");
  }
  return handle;
}

bool GenerationScheduler::Abort(const std::string& id, const std::string& message) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return false;
  it->second->Cancel(absl::OkStatus(), message);
  return true;
}

SchedulerInfo GenerationScheduler::Info() const {
  SchedulerInfo info;
  absl::MutexLock lock(&mu_);
  info.active_requests = static_cast<int>(in_flight_.size());
  info.draining = !admitting_;
  info.cached_sequences = cached_sequences_.load(std::memory_order_acquire);
  info.state_bytes = state_bytes_.load(std::memory_order_acquire);
  return info;
}

PrefixCacheStats GenerationScheduler::prefix_cache_stats() const {
  absl::MutexLock lock(&mu_);
  return prefix_stats_;
}

absl::Status GenerationScheduler::WithRunner(
    const std::function<absl::Status(StepRunner&)>& work) {
  absl::Notification done;
  absl::Status status;
  if (!actor_.Post([&] {
        status = work(*runner_);
        done.Notify();
      })) {
    return absl::UnavailableError("the scheduler is shut down");
  }
  done.WaitForNotification();
  return status;
}

void GenerationScheduler::UpdatePrefixStats() {
  const PrefixCacheStats stats = prefix_cache_->stats();
  if (prefix_metrics_) prefix_metrics_->Update(stats);
  absl::MutexLock lock(&mu_);
  prefix_stats_ = stats;
}

void GenerationScheduler::StopAdmitting() {
  absl::MutexLock lock(&mu_);
  admitting_ = false;
}

bool GenerationScheduler::WaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_.empty(); };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

struct GenerationScheduler::IdleWaiter {
  explicit IdleWaiter(std::function<void(bool)> done) : done(std::move(done)) {}
  void Fire(bool idle) {
    if (!fired.exchange(true)) done(idle);
  }
  std::function<void(bool)> done;
  std::atomic<bool> fired{false};
};

void GenerationScheduler::NotifyWhenIdle(absl::Time deadline, std::function<void(bool)> done) {
  auto waiter = std::make_shared<IdleWaiter>(std::move(done));
  auto idle = [this] {
    absl::MutexLock lock(&mu_);
    return in_flight_.empty();
  };
  const bool posted = actor_.Post([this, waiter, deadline, idle] {
    if (idle()) {
      waiter->Fire(true);
      return;
    }
    idle_waiters_.push_back(waiter);
    if (deadline != absl::InfiniteFuture()) {
      actor_.PostAfter(deadline - absl::Now(), [waiter] { waiter->Fire(false); });
    }
  });
  if (!posted) waiter->Fire(idle());  // shut down: nothing will run again
}

void GenerationScheduler::NotifyIdleWaiters(bool idle) {
  for (const std::shared_ptr<IdleWaiter>& waiter : idle_waiters_) waiter->Fire(idle);
  idle_waiters_.clear();
}

void GenerationScheduler::CancelAll(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, handle] : in_flight_) handle->Cancel(status, std::string(status.message()));
}

void GenerationScheduler::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    admitting_ = false;
    const absl::Status why = absl::UnavailableError("the server is shutting down");
    for (auto& [id, handle] : in_flight_) handle->Cancel(why, std::string(why.message()));
    // The final sweep: every Admit was posted before it (under mu_), so it sees every request.
    actor_.Post([this] {
      for (auto& sequence : running_) Finish(*sequence, sequence->handle->CancelResult());
      for (auto& sequence : waiting_) Finish(*sequence, sequence->handle->CancelResult());
      running_.clear();
      waiting_.clear();
      UpdateCounts();
    });
  }
  actor_.Stop();
  // The actor's thread is gone: waiters whose deadline timer was dropped hear it now.
  NotifyIdleWaiters(WaitIdle(absl::InfinitePast()));
}

void GenerationScheduler::Admit(std::shared_ptr<Sequence> sequence) {
  waiting_.push_back(std::move(sequence));
  PostStep();
}

void GenerationScheduler::PostStep() {
  if (step_posted_) return;
  step_posted_ = actor_.Post([this] { RunStep(); });
}

void GenerationScheduler::Finish(Sequence& sequence, GenerationResult result) {
  if (sequence.finished) return;
  sequence.finished = true;
  sequence.state.reset();
  UpdateCounts();
  result.prompt_tokens = static_cast<int>(sequence.request.prompt.size());
  result.generated_tokens = static_cast<int>(sequence.generated.size());
  bool idle;
  {
    absl::MutexLock lock(&mu_);
    in_flight_.erase(sequence.request.id);
    idle = in_flight_.empty();
    if (metrics_) metrics_->active->Set(static_cast<double>(in_flight_.size()));
  }
  if (metrics_) {
    metrics_->requests.WithLabels({FinishReasonName(result.reason)})->Increment();
    metrics_->request_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - sequence.submitted));
  }
  if (result.reason == FinishReason::kError) {
    LOG(WARNING) << "request " << sequence.request.id << " failed: " << result.status;
  }
  if (options_.spans != nullptr && sequence.request.trace.has_value()) {
    Span span;
    span.name = "k3.generate";
    span.context = sequence.request.trace->WithSpan(sequence.span_id);
    span.parent = sequence.request.trace->span_id;
    span.start = sequence.submitted;
    span.end = absl::Now();
    span.attributes = {{"k3.prompt_tokens", static_cast<double>(result.prompt_tokens)},
                       {"k3.generated_tokens", static_cast<double>(result.generated_tokens)},
                       {"k3.error", result.reason == FinishReason::kError ? 1.0 : 0.0}};
    options_.spans->Record(span);
  }
  sequence.sink->OnFinish(result);
  if (idle) NotifyIdleWaiters(true);
}

void GenerationScheduler::RemoveFinished() {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::shared_ptr<Sequence>& s) { return s->finished; }),
                 running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [](const std::shared_ptr<Sequence>& s) { return s->finished; }),
                 waiting_.end());
}

void GenerationScheduler::UpdateCounts() {
  int cached = 0;
  int64_t bytes = 0;
  for (const auto& sequence : running_) {
    if (sequence->state == nullptr) continue;
    ++cached;
    bytes += static_cast<int64_t>(sequence->state->ByteSize());
  }
  cached_sequences_.store(cached, std::memory_order_release);
  state_bytes_.store(bytes, std::memory_order_release);
  if (metrics_) {
    metrics_->cached->Set(cached);
    metrics_->state_bytes->Set(static_cast<double>(bytes));
  }
}

void GenerationScheduler::RunStep() {
  step_posted_ = false;
  DropCancelled();
  AdmitWaiting();
  if (running_.empty()) {
    UpdateCounts();
    return;
  }
  ExecuteStep(PlanStep());
  RemoveFinished();
  UpdateCounts();
  if (!running_.empty() || !waiting_.empty()) PostStep();
}

void GenerationScheduler::DropCancelled() {
  for (auto& sequence : running_) {
    if (sequence->handle->cancelled()) Finish(*sequence, sequence->handle->CancelResult());
  }
  for (auto& sequence : waiting_) {
    if (sequence->handle->cancelled()) Finish(*sequence, sequence->handle->CancelResult());
  }
  RemoveFinished();
}

void GenerationScheduler::AdmitWaiting() {
  while (!waiting_.empty() && running_.size() < static_cast<size_t>(options_.max_sequences)) {
    Sequence& sequence = *waiting_.front();
    absl::StatusOr<std::unique_ptr<SequenceState>> state = runner_->NewState();
    if (!state.ok()) {  // no room on the device: the request ends, the others go on
      Finish(sequence, ErrorResult(state.status()));
      waiting_.pop_front();
      continue;
    }
    sequence.state = *std::move(state);
    if (prefix_cache_) {
      const int64_t restored =
          prefix_cache_->Restore(sequence.request.prompt, sequence.state.get());
      sequence.consumed = static_cast<size_t>(restored);
      UpdatePrefixStats();
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

StepPack GenerationScheduler::PlanStep() {
  std::vector<PackInput> inputs;
  inputs.reserve(running_.size());
  int64_t decoders = 0;
  absl::Time oldest_prompt = absl::InfiniteFuture();
  for (const auto& sequence : running_) {
    inputs.push_back({PrefillTarget(*sequence), static_cast<int64_t>(sequence->consumed)});
    if (sequence->decoding()) {
      ++decoders;
    } else {
      oldest_prompt = std::min(oldest_prompt, sequence->submitted);
    }
  }
  if (!waiting_.empty()) oldest_prompt = std::min(oldest_prompt, waiting_.front()->submitted);
  PackLimits limits;
  limits.max_tokens = options_.max_batch_tokens;
  limits.prompt_floor = std::min<int64_t>(options_.min_prefill_chunk, options_.max_batch_tokens);
  // Cut where the prefix cache can snapshot (its blocks are whole KDA chunks).
  limits.granule = prefix_cache_ ? prefix_cache_->block_tokens() : kKdaChunk;
  // Batch invariant: KDA's chunks lie at fixed positions of the prompt, whatever the budget.
  limits.chunk = BatchInvariant() ? kKdaChunk : 0;
  const int64_t decode_tokens =
      std::min<int64_t>(decoders, options_.max_batch_tokens - limits.prompt_floor);
  const absl::Duration wait = oldest_prompt == absl::InfiniteFuture()
                                  ? absl::ZeroDuration()
                                  : absl::Now() - oldest_prompt;
  limits.prompt_budget =
      options_.adaptive_prefill || decoders == 0
          ? step_budget_.PromptTokens(std::max<int64_t>(decode_tokens, 0), wait)
          : options_.max_batch_tokens;
  return packer_.Pack(inputs, limits);
}

void GenerationScheduler::ExecuteStep(const StepPack& pack) {
  std::vector<BatchEntry> batch;
  std::vector<Sequence*> members;
  std::vector<bool> samples;  // whether the entry's logits row yields a token
  for (size_t index : pack.decode) {
    Sequence* sequence = running_[index].get();
    batch.push_back(
        {sequence->state.get(), absl::MakeConstSpan(&sequence->generated.back(), 1), false});
    members.push_back(sequence);
    samples.push_back(true);
  }
  for (const PrefillChunk& chunk : pack.prefill) {
    Sequence* sequence = running_[chunk.index].get();
    const std::vector<int32_t>& prompt = sequence->request.prompt;
    batch.push_back({sequence->state.get(),
                     absl::MakeConstSpan(prompt.data() + sequence->consumed, chunk.tokens),
                     false});
    members.push_back(sequence);
    // A chunk that completes the packer's target completes the prompt unless that target was
    // the prompt's last block boundary (PrefillTarget).
    samples.push_back(static_cast<size_t>(chunk.tokens) + sequence->consumed == prompt.size());
  }
  std::vector<Sequence*> traced;
  for (size_t i = 0; i < members.size() && options_.spans != nullptr; ++i) {
    Sequence* sequence = members[i];
    if (!sequence->request.trace.has_value()) continue;
    sequence->step_trace = sequence->request.trace->WithSpan(NewSpanId());
    batch[i].trace = &sequence->step_trace;
    traced.push_back(sequence);
  }
  const absl::Time start = absl::Now();
  const absl::Status status = runner_->Step(batch, &logits_);
  const absl::Duration step_time = absl::Now() - start;
  RecordStep(pack, traced, start, step_time, status);
  if (!status.ok()) {
    const GenerationResult result = ErrorResult(StepFailure(status));
    for (Sequence* sequence : members) Finish(*sequence, result);
    return;
  }
  step_budget_.ObserveStep(pack.tokens(), step_time);
  if (metrics_) {
    metrics_->step.fixed->Set(absl::ToDoubleSeconds(step_budget_.fixed_cost()));
    metrics_->step.per_token->Set(absl::ToDoubleSeconds(step_budget_.per_token_cost()));
    metrics_->step.target->Set(absl::ToDoubleSeconds(step_budget_.target_step_time()));
  }
  if (metrics_) metrics_->prompt_tokens->Increment(static_cast<double>(pack.prefill_tokens()));
  for (size_t i = 0; i < members.size(); ++i) {
    if (!members[i]->decoding()) members[i]->consumed += batch[i].tokens.size();
    if (prefix_cache_) RecordPrefix(*members[i]);
  }
  if (prefix_cache_) UpdatePrefixStats();
  DeliverTokens(members, samples);
}

int64_t GenerationScheduler::PrefillTarget(const Sequence& sequence) const {
  const int64_t prompt = static_cast<int64_t>(sequence.request.prompt.size());
  if (!prefix_cache_ || sequence.decoding()) return prompt;
  return prefix_cache_->PrefillCut(static_cast<int64_t>(sequence.consumed), prompt);
}

void GenerationScheduler::RecordPrefix(const Sequence& sequence) {
  const SequenceState& state = *sequence.state;
  if (state.length % prefix_cache_->block_tokens() != 0) return;
  const std::vector<int32_t>& prompt = sequence.request.prompt;
  absl::Status recorded;
  if (state.length <= static_cast<int64_t>(prompt.size())) {
    recorded = prefix_cache_->Record(prompt, state);
  } else if (BatchInvariant()) {
    // A decoded token's KDA state comes from the recurrence, a prompt's from the chunked form: a
    // later prompt through these tokens would continue from other bits than its cold prefill.
    return;
  } else {  // decoding: the state has consumed the prompt and every generated token
    std::vector<int32_t> consumed = prompt;
    consumed.insert(consumed.end(), sequence.generated.begin(), sequence.generated.end());
    recorded = prefix_cache_->Record(consumed, state);
  }
  // Only a state/token mismatch fails, which would be a scheduler bug: the cache stays correct.
  LOG_IF(ERROR, !recorded.ok()) << "prefix cache: " << recorded;
}

void GenerationScheduler::RecordStep(const StepPack& pack, const std::vector<Sequence*>& traced,
                                     absl::Time start, absl::Duration step_time,
                                     const absl::Status& status) {
  const StepProfile& profile = runner_->last_profile();
  for (Sequence* sequence : traced) {
    Span span;
    span.name = "k3.step";
    span.context = sequence->step_trace;
    span.parent = sequence->span_id;
    span.start = start;
    span.end = start + step_time;
    span.attributes = {{"k3.batch_tokens", static_cast<double>(pack.tokens())},
                       {"k3.prefill", sequence->decoding() ? 0.0 : 1.0},
                       {"k3.ok", status.ok() ? 1.0 : 0.0},
                       {"k3.compute_ms", absl::ToDoubleMilliseconds(profile.compute())},
                       {"k3.moe_wait_ms", absl::ToDoubleMilliseconds(profile.moe_wait)}};
    options_.spans->Record(span);
  }
  if (!metrics_) return;
  metrics_->step.seconds->Observe(absl::ToDoubleSeconds(step_time));
  metrics_->step.compute->Observe(absl::ToDoubleSeconds(profile.compute()));
  metrics_->step.moe_wait->Observe(absl::ToDoubleSeconds(profile.moe_wait));
  for (absl::Duration wait : profile.layer_moe_wait) {
    metrics_->step.layer_moe_wait->Observe(absl::ToDoubleSeconds(wait));
  }
  metrics_->step.tokens->Observe(static_cast<double>(pack.tokens()));
  if (profile.ping_pong) metrics_->step.ping_pong->Increment();
}

void GenerationScheduler::DeliverTokens(const std::vector<Sequence*>& members,
                                        const std::vector<bool>& samples) {
  const int64_t vocab = config().vocab_size;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!samples[i]) continue;
    Sequence& sequence = *members[i];
    const float* row = logits_.data() + i * vocab;
    if (absl::Status finite = CheckLogitsFinite(row, vocab); !finite.ok()) {
      Finish(sequence, ErrorResult(std::move(finite)));
      continue;
    }
    const int32_t token = sequence.sampler.Next(row, vocab);
    sequence.generated.push_back(token);
    const int generated = static_cast<int>(sequence.generated.size());
    if (metrics_) {
      const absl::Time now = absl::Now();
      metrics_->generated_tokens->Increment();
      if (generated == 1) {
        metrics_->time_to_first_token->Observe(absl::ToDoubleSeconds(now - sequence.submitted));
      } else {
        metrics_->inter_token->Observe(absl::ToDoubleSeconds(now - sequence.last_token));
      }
      sequence.last_token = now;
    }
    if (sequence.request.top_logprobs >= 0) {
      sequence.sink->OnLogprobs(LogprobsOf(row, vocab, token, sequence.request.top_logprobs));
    }
    sequence.sink->OnToken(token, static_cast<int>(sequence.request.prompt.size()), generated);
    const std::vector<int32_t>& stops = sequence.request.stop_token_ids;
    if ((token == config().eos_token_id && !sequence.request.ignore_eos) ||
        std::find(stops.begin(), stops.end(), token) != stops.end()) {
      Finish(sequence, GenerationResult{FinishReason::kStop});
    } else if (generated >= sequence.request.max_new_tokens) {
      Finish(sequence, GenerationResult{FinishReason::kLength});
    }
  }
}

}  // namespace k3
