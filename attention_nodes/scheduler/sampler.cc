#include "attention_nodes/scheduler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace k3 {

absl::Status ValidateSamplingOptions(const SamplingOptions& options) {
  if (!(options.temperature >= 0.f) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError("temperature must be a finite value >= 0");
  }
  if (!(options.top_p > 0.f && options.top_p <= 1.f)) {
    return absl::InvalidArgumentError("top_p must lie in (0, 1]");
  }
  if (options.top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0");
  return absl::OkStatus();
}

absl::Status CheckLogitsFinite(const float* logits, int64_t vocab) {
  bool finite = true;
  for (int64_t i = 0; i < vocab; ++i) finite &= std::isfinite(logits[i]);
  if (finite) return absl::OkStatus();
  return absl::InternalError(
      "the model produced non-finite logits (NaN or infinity); no token can be sampled");
}

TokenLogprobs LogprobsOf(const float* logits, int64_t vocab, int32_t token, int top) {
  const float max = *std::max_element(logits, logits + vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(total);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_z); };
  TokenLogprobs result{.logprob = logprob(token)};
  if (top <= 0) return result;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = std::min<int64_t>(top, vocab);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < keep; ++i) result.top.emplace_back(order[i], logprob(order[i]));
  return result;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (options.constraint != nullptr) {
    constraint_.emplace(options.vocabulary, options.constraint, options.constraint_max_tokens);
  }
}

int32_t Sampler::Next(const float* logits, int64_t vocab) {
  if (!constraint_.has_value() || !constraint_->Allowed(&allowed_)) return Pick(logits, vocab);
  masked_.assign(logits, logits + vocab);
  for (int64_t id = 0; id < vocab; ++id) {
    if (id >= static_cast<int64_t>(allowed_.size()) || !allowed_[id]) {
      masked_[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const int32_t id = Pick(masked_.data(), vocab);
  constraint_->Advance(id);
  return id;
}

int32_t Sampler::Pick(const float* logits, int64_t vocab) {
  if (options_.temperature == 0.f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  int64_t keep = options_.top_k > 0 ? std::min<int64_t>(options_.top_k, vocab) : vocab;
  auto higher = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), higher);
  probs_.resize(keep);
  const double top = logits[order_[0]];
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp((logits[order_[i]] - top) / options_.temperature);
    total += probs_[i];
  }
  if (options_.top_p < 1.f) {
    double mass = 0.0;
    int64_t cut = 0;
    while (cut < keep) {
      mass += probs_[cut++] / total;
      if (mass >= options_.top_p) break;
    }
    keep = cut;
    total = std::accumulate(probs_.begin(), probs_.begin() + keep, 0.0);
  }
  // 53 random bits, so the draw does not depend on the standard library's distributions.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace k3
