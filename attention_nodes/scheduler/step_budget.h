// StepBudget: how many prompt tokens the next model step may take, from measured step times.
//
// It models a step's wall time as fixed + per_token x tokens (decode tokens and prefill chunks
// alike: both are rows of the same products; the fixed part is reading the weights once) and
// fits the two by least squares over the steps the scheduler reports, older steps weighing less
// (`decay` per step), so the model follows a prompt's position (MLA attends over the prefix)
// and the machine's load. The step time target is `target` when set, else `target_factor` x the
// time of a one-token step: what one stream alone sees between tokens (the moving average of
// one-token steps, weighing the newest by 1 - decay; fixed + per_token before one was seen. The
// line's intercept overstates it: a lone token reads only its own experts' weights).
// With sequences decoding, PromptTokens is what fits the target beside their decode tokens:
// (target - fixed - per_token x decode) / per_token, at least `min_prompt_tokens` (so a queue
// always progresses), at most twice the largest recent step plus `min_prompt_tokens` (the line
// is not trusted far beyond the steps it was fitted on; "recent": shrinking by `decay` per step), and at most `max_tokens` less the decode tokens.
// Without decoding sequences there is no latency to protect: the whole `max_tokens`.
//
// No prompt starves: once the oldest waiting prompt has waited longer than `ttft_target`, the
// prompt budget grows in proportion (a prompt waiting 3x the target gets 3x the budget), trading
// running streams' inter-token latency for the queue's first tokens.
//
// Deterministic: it reads no clock; the caller passes measured durations and waits. Not
// thread-safe (the scheduler thread owns it).
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_BUDGET_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_BUDGET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace k3 {

struct StepBudgetOptions {
  int64_t max_tokens = 2048;         // tokens per step at most (decode and prefill)
  int64_t min_prompt_tokens = 16;    // floor while prompts wait (KDA's chunk)
  absl::Duration target = absl::ZeroDuration();  // step time target; zero: target_factor
  double target_factor = 2.0;        // x a one-token step's time, when target is zero; >= 1
  absl::Duration ttft_target = absl::Seconds(2);  // beyond it the prompt budget grows; > 0
  double decay = 0.9;                // weight an observation keeps per later step, (0, 1)

  // INVALID_ARGUMENT naming the first field out of range.
  absl::Status Validate() const;
};

class StepBudget {
 public:
  // REQUIRES: options.Validate() is OK (CHECK-fails otherwise).
  explicit StepBudget(const StepBudgetOptions& options);

  // Prompt tokens the next step may take beside `decode_tokens` decode tokens, when the oldest
  // prompt not yet done has waited `oldest_prompt_wait` since it was submitted.
  int64_t PromptTokens(int64_t decode_tokens, absl::Duration oldest_prompt_wait) const;

  // Reports a finished step: the tokens it computed and its wall time.
  void ObserveStep(int64_t tokens, absl::Duration step_time);

  // The fitted model and the target it implies; zero before two distinct step sizes were seen.
  absl::Duration fixed_cost() const { return fixed_; }
  absl::Duration per_token_cost() const { return per_token_; }
  absl::Duration target_step_time() const;

 private:
  void Refit();

  const StepBudgetOptions options_;
  // Decayed sums over observations of (n tokens, t seconds): weight, n, t, n*n, n*t.
  double w_ = 0, n_ = 0, t_ = 0, nn_ = 0, nt_ = 0;
  double span_ = 0;  // the largest step's tokens, shrinking by `decay` per step
  absl::Duration single_ = absl::ZeroDuration();  // one-token steps' moving average
  bool single_seen_ = false;
  absl::Duration fixed_ = absl::ZeroDuration();
  absl::Duration per_token_ = absl::ZeroDuration();
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_BUDGET_H_
