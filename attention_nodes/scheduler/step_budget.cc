#include "attention_nodes/scheduler/step_budget.h"

#include <algorithm>
#include <cmath>

#include "glog/logging.h"

namespace k3 {

absl::Status StepBudgetOptions::Validate() const {
  if (max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be >= 1");
  if (min_prompt_tokens < 1) return absl::InvalidArgumentError("min_prompt_tokens must be >= 1");
  if (target < absl::ZeroDuration()) return absl::InvalidArgumentError("target must be >= 0");
  if (!(target_factor >= 1.0)) return absl::InvalidArgumentError("target_factor must be >= 1");
  if (ttft_target <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ttft_target must be > 0");
  }
  if (!(decay > 0.0 && decay < 1.0)) return absl::InvalidArgumentError("decay must lie in (0, 1)");
  return absl::OkStatus();
}

StepBudget::StepBudget(const StepBudgetOptions& options) : options_(options) {
  const absl::Status valid = options_.Validate();
  CHECK(valid.ok()) << valid;
}

absl::Duration StepBudget::target_step_time() const {
  if (options_.target > absl::ZeroDuration()) return options_.target;
  return (single_seen_ ? single_ : fixed_ + per_token_) * options_.target_factor;
}

void StepBudget::ObserveStep(int64_t tokens, absl::Duration step_time) {
  if (tokens < 1) return;
  const double d = options_.decay;
  const double n = static_cast<double>(tokens);
  const double t = absl::ToDoubleSeconds(step_time);
  w_ = w_ * d + 1;
  n_ = n_ * d + n;
  t_ = t_ * d + t;
  nn_ = nn_ * d + n * n;
  nt_ = nt_ * d + n * t;
  span_ = std::max(n, span_ * d);
  if (tokens == 1) {
    single_ = single_seen_ ? single_ * d + step_time * (1 - d) : step_time;
    single_seen_ = true;
  }
  Refit();
}

void StepBudget::Refit() {
  const double mean_n = n_ / w_;
  const double mean_t = t_ / w_;
  const double var = nn_ / w_ - mean_n * mean_n;
  // Steps all of (nearly) one size say nothing about the slope: keep the last fit.
  if (var < 0.25) return;
  const double slope = std::max((nt_ / w_ - mean_n * mean_t) / var, 1e-9);
  per_token_ = absl::Seconds(slope);
  fixed_ = absl::Seconds(std::max(mean_t - slope * mean_n, 0.0));
}

int64_t StepBudget::PromptTokens(int64_t decode_tokens, absl::Duration oldest_prompt_wait) const {
  const int64_t room = options_.max_tokens - decode_tokens;
  if (room <= 0) return 0;
  if (decode_tokens == 0) return room;
  const double floor = static_cast<double>(options_.min_prompt_tokens);
  double tokens = floor;
  if (per_token_ > absl::ZeroDuration()) {
    const absl::Duration spare =
        target_step_time() - fixed_ - per_token_ * static_cast<double>(decode_tokens);
    tokens = std::max(absl::FDivDuration(spare, per_token_), floor);
  }
  if (oldest_prompt_wait > options_.ttft_target) {
    tokens *= absl::FDivDuration(oldest_prompt_wait, options_.ttft_target);
  }
  tokens = std::min(tokens, 2 * span_ + floor);
  return std::min(static_cast<int64_t>(tokens), room);
}

}  // namespace k3
