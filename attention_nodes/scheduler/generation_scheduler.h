// GenerationScheduler: continuous batching of generation requests over one ModelRunner.
//
// One scheduler thread (an Actor) owns the ModelRunner and every request's SequenceState. It runs
// model steps back to back while there is work; between two steps it admits submitted requests,
// drops cancelled ones and frees the state of finished ones. Each step packs up to
// `max_batch_tokens` tokens (StepPacker, step_packer.h): one decode token for every sequence that
// has consumed its prompt, plus prefill chunks of as many prompts as the step's prompt budget
// allows (the oldest prompt first, then short prompts that complete, then arrival order; a
// prompt longer than what it gets continues in the next steps: chunked prefill). While some
// sequences decode and `adaptive_prefill` is on, the prompt budget is StepBudget's
// (step_budget.h): what fits beside the decode tokens in a step time target (`step_target`, or
// `step_target_factor` x a one-token step, fitted from measured steps), at least
// `min_prefill_chunk`, growing once the oldest prompt has waited past `ttft_target`; so
// throughput grows with the streams while their inter-token latency stays near the target.
// Without decoding sequences a step takes up to `max_batch_tokens` prompt tokens. Where a prompt
// is cut does not change its tokens.
//
// Admission (AdmitWaiting) is the one place a request's state is created: a waiting request
// enters the running set, in submission order, while fewer than `max_sequences` hold state.
// A sequence whose prompt completes in a step samples its first token from that step's logits;
// a decoding sequence samples one token per step. Each sequence samples with its own Sampler
// (seeded per request, one draw per token), so its tokens do not depend on what it is batched
// with: batch invariant (base/batch_invariance.h, the default), its logits are bitwise those it
// gets alone (prompts are cut on KDA's chunk grid, PackLimits::chunk, and the prefix cache keeps
// only prefill-made states).
//
// At most `max_sequences` requests hold state at once; later ones wait (unadmitted, stateless)
// in submission order.
//
// A request ends exactly once, with GenerationSink::OnFinish:
//   LENGTH    max_new_tokens generated;
//   STOP      a stop token, or the model's eos_token_id unless ignore_eos, was generated (it is
//             part of the output);
//   CANCELLED RequestHandle::Cancel / Abort (status OK) or shutdown (status UNAVAILABLE);
//   ERROR     the model step failed, e.g. a lost expert worker (status UNAVAILABLE with the
//             cause; INTERNAL for errors that retrying cannot fix). Every sequence of the failed
//             step ends so (their states are inconsistent); the others continue. Also a
//             sequence whose logits are not finite (status INTERNAL): it gets no token.
// Before OnFinish runs, the request's state is freed and it has left Info()'s counts, so a client
// that sees the end can observe the freed state.
//
// Metrics (when a registry is given): SchedulerMetrics' series (scheduler_metrics.h) and,
// with the prefix cache, PrefixCacheMetrics' series (prefix_cache_metrics.h).
//
// Thread-safety: all public methods may be called from any thread. Sinks are called on the
// scheduler thread and must not block.
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_GENERATION_SCHEDULER_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_GENERATION_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attention_nodes/forward/model_runner.h"
#include "attention_nodes/scheduler/prefix_cache.h"
#include "attention_nodes/scheduler/prefix_cache_metrics.h"
#include "attention_nodes/scheduler/sampler.h"
#include "attention_nodes/scheduler/scheduler_metrics.h"
#include "attention_nodes/scheduler/step_budget.h"
#include "attention_nodes/scheduler/step_packer.h"
#include "attention_nodes/forward/step_runner.h"
#include "cluster/actor.h"
#include "cluster/metrics.h"
#include "cluster/span_log.h"
#include "base/trace_context.h"
#include "model/weights.h"
#include "moe/routed_moe.h"

namespace k3 {

struct SchedulerOptions {
  int64_t max_batch_tokens = 2048;  // tokens per model step, decode tokens and prefill chunks
  int max_sequences = 64;           // requests holding KV/KDA state at once
  int max_new_tokens_limit = 4096;  // requests asking for more are rejected
  int max_prompt_tokens = 32768;    // longer prompts are rejected
  // Prompt tokens per step while sequences decode (StepBudget, see above); off: prompts take
  // the whole rest of max_batch_tokens.
  bool adaptive_prefill = true;
  absl::Duration step_target = absl::ZeroDuration();  // zero: step_target_factor x 1-token step
  double step_target_factor = 2.0;                    // >= 1
  absl::Duration ttft_target = absl::Seconds(2);      // > 0; beyond it prompts get more
  // >= 1; prompt tokens a step takes at least while prompts wait (KDA's chunk).
  int64_t min_prefill_chunk = 16;
  // The prefix cache (prefix_cache.h): a request's prompt starts from its longest cached prefix,
  // and every sequence's state is recorded at block boundaries (prompts are cut at their last
  // one). prefix_cache_bytes 0: off.
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  int64_t prefix_block_tokens = 64;  // a multiple of kKdaChunk
  // When steps of two or more sequences run as two ping-pong micro-batches (where the MoE tier
  // keeps two layers in flight; ModelRunner::set_ping_pong).
  PingPong ping_pong = PingPong::kMeasured;
  // Where traced requests' spans go (not owned; outlives the scheduler): "k3.generate" for the
  // request (under the client's span) and "k3.step" for each model step it took part in (under
  // the request's span; the router's and expert workers' spans of that step hang under it).
  // Null: no spans.
  SpanLog* spans = nullptr;

  // INVALID_ARGUMENT naming the first option out of range.
  absl::Status Validate() const;
};

// Longest request id accepted: ids are logged and echoed to the client.
inline constexpr size_t kMaxRequestIdBytes = 256;

struct GenerationRequest {
  // Unique among requests in flight, at most kMaxRequestIdBytes; empty: the scheduler assigns one.
  std::string id;
  std::vector<int32_t> prompt;
  SamplingOptions sampling;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  // true: the model's eos_token_id does not end the request
  // >= 0: OnLogprobs reports each token's log-probability and this many top alternatives.
  int top_logprobs = -1;
  // A sampled W3C trace context from the client (its `traceparent`): the request's spans go to
  // SchedulerOptions::spans, and its steps' contexts travel with the MoE rows.
  std::optional<TraceContext> trace;
};

// FinishReasonName lists the names in this order.
enum class FinishReason { kLength, kStop, kCancelled, kError };

const char* FinishReasonName(FinishReason reason);

struct GenerationResult {
  FinishReason reason = FinishReason::kLength;
  int prompt_tokens = 0;
  int generated_tokens = 0;
  // How the call should end: OK for kLength, kStop and a cancelled request; UNAVAILABLE for
  // shutdown and failed steps (INTERNAL for failures retrying cannot fix).
  absl::Status status;
  std::string message;  // why, for kCancelled and kError
};

// Receives one request's output. Called on the scheduler thread; must not block.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // A new token; counts are cumulative, this token included.
  virtual void OnToken(int32_t token, int prompt_tokens, int generated_tokens) = 0;
  // With GenerationRequest::top_logprobs >= 0: the next token's log-probabilities, just before
  // its OnToken.
  virtual void OnLogprobs(const TokenLogprobs& /*logprobs*/) {}
  // The end, exactly once, after every OnToken.
  virtual void OnFinish(const GenerationResult& result) = 0;
};

// A submitted request, as its submitter sees it.
class RequestHandle {
 public:
  explicit RequestHandle(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Asks the scheduler to end the request with CANCELLED and `message` at the next step boundary.
  // `status` is how the call ends (OK for an abort). Only the first call counts. Thread-safe.
  void Cancel(absl::Status status, std::string message);

  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // REQUIRES: cancelled().
  GenerationResult CancelResult() const;

 private:
  const std::string id_;
  mutable absl::Mutex mu_;
  std::atomic<bool> cancelled_{false};
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::string message_ ABSL_GUARDED_BY(mu_);
};

struct SchedulerInfo {
  int active_requests = 0;    // submitted and not yet finished
  int cached_sequences = 0;   // requests holding a SequenceState
  int64_t state_bytes = 0;    // SequenceState::ByteSize over them
  bool draining = false;
};

class GenerationScheduler {
 public:
  // Steps on a ModelRunner (the CPU). `weights` and `routed_moe` must outlive the scheduler; the
  // scheduler thread is their only user. `metrics` may be null. REQUIRES: options.Validate() is
  // OK (CHECK-fails otherwise).
  GenerationScheduler(const ModelWeights* weights, RoutedMoe* routed_moe,
                      const SchedulerOptions& options, MetricsRegistry* metrics);
  // Steps on `runner` (e.g. a GpuStepRunner), which the scheduler thread then owns. The prefix
  // cache is on only where the runner keeps states on the host.
  GenerationScheduler(std::unique_ptr<StepRunner> runner, const SchedulerOptions& options,
                      MetricsRegistry* metrics);
  // Shutdown().
  ~GenerationScheduler();

  GenerationScheduler(const GenerationScheduler&) = delete;
  GenerationScheduler& operator=(const GenerationScheduler&) = delete;

  const ModelConfig& config() const { return runner_->config(); }  // immutable
  const SchedulerOptions& options() const { return options_; }

  // INVALID_ARGUMENT naming what is wrong: an id longer than kMaxRequestIdBytes, empty or too
  // long prompt, token ids outside the vocabulary (prompt or stop tokens), max_new_tokens outside
  // [1, max_new_tokens_limit], bad sampling options.
  absl::Status Validate(const GenerationRequest& request) const;

  // Validates and queues `request`; `sink` gets its output. Errors: INVALID_ARGUMENT (Validate),
  // ALREADY_EXISTS (the id is in flight), UNAVAILABLE (draining or shut down).
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerationRequest request,
                                                        std::shared_ptr<GenerationSink> sink);

  // Cancels the request in flight with this id (finish reason CANCELLED, call status OK).
  // False when there is none.
  bool Abort(const std::string& id, const std::string& message);

  SchedulerInfo Info() const;
  // The prefix cache's counts after the last step that used it (zeros when it is off).
  PrefixCacheStats prefix_cache_stats() const;

  // Runs `work` with the runner on the scheduler thread between two steps and returns its status;
  // requests in flight wait meanwhile. For tools that step a sequence of their own (`k3serve
  // logits`); `work` must let its states go before it returns. Blocks the caller: not for the
  // scheduler thread, actors or gRPC handlers. UNAVAILABLE after Shutdown.
  absl::Status WithRunner(const std::function<absl::Status(StepRunner&)>& work);

  // Stops admitting: later Submits get UNAVAILABLE; requests in flight continue.
  void StopAdmitting();
  // Waits until no request is in flight; false at `deadline`. Blocks: not for actors or gRPC
  // handlers (they use NotifyWhenIdle).
  bool WaitIdle(absl::Time deadline) const;
  // Calls `done(true)` once no request is in flight, or `done(false)` at `deadline` if some still
  // are (no later than the scheduler step running then ends); exactly once, on the scheduler
  // thread, or at once on the caller's after Shutdown. `done` must not block.
  void NotifyWhenIdle(absl::Time deadline, std::function<void(bool idle)> done);
  // Cancels every request in flight with `status` (CANCELLED finish reason).
  void CancelAll(const absl::Status& status);

  // Stops admitting, cancels what is in flight with UNAVAILABLE "shutting down" and stops the
  // scheduler thread. Idempotent.
  void Shutdown();

 private:
  struct Sequence;

  // Scheduler thread only.
  void Admit(std::shared_ptr<Sequence> sequence);
  void PostStep();
  void RunStep();
  void DropCancelled();
  // Moves waiting requests into the running set (with fresh state) while room is left.
  void AdmitWaiting();
  StepPack PlanStep();
  // Runs `pack` as one model step and hands out its tokens.
  void ExecuteStep(const StepPack& pack);
  void RecordStep(const StepPack& pack, const std::vector<Sequence*>& traced, absl::Time start,
                  absl::Duration step_time, const absl::Status& status);
  // Samples and delivers the token of members[i] for every i with samples[i].
  void DeliverTokens(const std::vector<Sequence*>& members, const std::vector<bool>& samples);
  // Where `sequence`'s prefill goes next: its prompt's last block boundary first (so the prefix
  // cache gets a snapshot there), then the prompt's end.
  int64_t PrefillTarget(const Sequence& sequence) const;
  // Stores `sequence`'s state in the prefix cache when it stands at a block boundary.
  void RecordPrefix(const Sequence& sequence);
  void Finish(Sequence& sequence, GenerationResult result);
  // Fires and forgets every idle_waiters_ entry.
  void NotifyIdleWaiters(bool idle);
  void RemoveFinished();
  void UpdateCounts();
  // Publishes the prefix cache's counts (metrics and prefix_cache_stats()).
  void UpdatePrefixStats();

  const SchedulerOptions options_;
  std::unique_ptr<SchedulerMetrics> metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<RequestHandle>> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  PrefixCacheStats prefix_stats_ ABSL_GUARDED_BY(mu_);
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<int> cached_sequences_{0};
  std::atomic<int64_t> state_bytes_{0};

  // Scheduler thread only (config() aside).
  const std::unique_ptr<StepRunner> runner_;
  StepBudget step_budget_;
  StepPacker packer_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // null: off
  std::unique_ptr<PrefixCacheMetrics> prefix_metrics_;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  std::vector<std::shared_ptr<Sequence>> running_;  // in admission order
  bool step_posted_ = false;
  std::vector<float> logits_;
  // NotifyWhenIdle callers waiting for in_flight_ to empty (each also has a deadline timer).
  struct IdleWaiter;
  std::vector<std::shared_ptr<IdleWaiter>> idle_waiters_;

  Actor actor_;  // last: its thread stops before the members above go away
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_GENERATION_SCHEDULER_H_
