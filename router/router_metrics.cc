#include "router/router_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace k3 {

RouterMetrics::RouterMetrics(MetricsRegistry* registry, int per_expert_ids)
    : steps_(registry->AddCounter("k3_router_steps_total",
                                  "MoE layer steps answered, by status code", {"code"})),
      step_seconds_(registry
                        ->AddHistogram("k3_router_step_seconds",
                                       "Time from a MoeRequest's arrival to its MoeResponse",
                                       ExponentialBuckets(1e-4, 2, 18))
                        .Get()),
      step_compute_(registry
                        ->AddHistogram("k3_router_step_compute_seconds",
                                       "Router compute of one answered MoE layer step: gate, "
                                       "top-k, dispatch plan and encoding, then the combine",
                                       ExponentialBuckets(1e-5, 2, 20))
                        .Get()),
      step_expert_wait_(registry
                            ->AddHistogram("k3_router_step_expert_wait_seconds",
                                           "From a MoE layer step's last ExpertRequest sent to "
                                           "its last answer: the wire both ways plus the expert "
                                           "workers' k3_expert_request_seconds",
                                           ExponentialBuckets(1e-5, 2, 20))
                            .Get()),
      pending_(registry->AddGauge("k3_router_pending_steps", "MoE layer steps in flight").Get()),
      tokens_(registry->AddCounter("k3_router_routed_tokens_total",
                                   "Tokens routed, by MoE layer index", {"layer"})),
      max_vio_(registry->AddGauge(
          "k3_router_expert_load_max_vio",
          "(max - mean) / mean tokens per expert over the load-statistics window, by MoE layer",
          {"layer"})) {
  if (per_expert_ids <= 0) return;
  MetricFamily<Counter>& family = registry->AddCounter(
      "k3_router_expert_routed_tokens_total",
      "Tokens routed to each expert id, summed over MoE layers (opt-in: --per-expert-metrics)",
      {"expert"});
  for (int e = 0; e < per_expert_ids; ++e) {
    expert_tokens_.push_back(family.WithLabels({absl::StrCat(e)}));
  }
}

void RouterMetrics::CountRouted(int moe_layer, int64_t tokens, double max_vio,
                                const std::vector<int32_t>& experts) {
  const std::string label = absl::StrCat(moe_layer);
  tokens_.WithLabels({label})->Increment(static_cast<double>(tokens));
  max_vio_.WithLabels({label})->Set(max_vio);
  if (expert_tokens_.empty()) return;
  // Count per expert first: one atomic add per expert, not per (token, expert).
  std::vector<int64_t> counts(expert_tokens_.size(), 0);
  for (int32_t e : experts) ++counts[e];
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) expert_tokens_[e]->Increment(static_cast<double>(counts[e]));
  }
}

void RouterMetrics::CountAnswer(absl::StatusCode code, absl::Duration since_arrival) {
  steps_.WithLabels({absl::StatusCodeToString(code)})->Increment();
  step_seconds_->Observe(absl::ToDoubleSeconds(since_arrival));
}

void RouterMetrics::ObserveAnswered(absl::Duration compute, absl::Duration expert_wait) {
  step_compute_->Observe(absl::ToDoubleSeconds(compute));
  step_expert_wait_->Observe(absl::ToDoubleSeconds(expert_wait));
}

void RouterMetrics::SetPending(size_t steps) { pending_->Set(static_cast<double>(steps)); }

}  // namespace k3
