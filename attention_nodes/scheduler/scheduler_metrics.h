// The generation scheduler's Prometheus series (GenerationScheduler updates them; they are
// registered when the scheduler is given a registry). Per request:
//   requests:            k3_attention_requests_total{finish_reason}
//   rejected:            k3_attention_rejected_requests_total
//   prompt_tokens:       k3_attention_prompt_tokens_total
//   generated_tokens:    k3_attention_generated_tokens_total
//   active:              k3_attention_active_requests
//   cached:              k3_attention_cached_sequences
//   state_bytes:         k3_attention_request_state_bytes
// and the latencies users see, from Submit:
//   time_to_first_token: k3_attention_time_to_first_token_seconds (one observation per request
//                        with a token)
//   inter_token:         k3_attention_inter_token_seconds (one per token after a request's first)
//   request_seconds:     k3_attention_request_seconds (end to end: one per request that ends,
//                        whatever the reason)
// Per model step (SchedulerStepMetrics):
//   seconds:             k3_attention_step_seconds
//   tokens:              k3_attention_step_tokens
//   StepBudget's fit:    fixed, per_token, target: k3_attention_step_fixed_seconds,
//                        k3_attention_step_per_token_seconds, k3_attention_step_target_seconds
//   ping_pong:           k3_attention_ping_pong_steps_total
// and where each step's time went (ModelRunner's StepProfile): compute and moe_wait,
// k3_attention_step_compute_seconds and k3_attention_step_moe_wait_seconds (one observation per
// step each); layer_moe_wait, k3_attention_layer_moe_wait_seconds (one per MoE layer of a step).
//
// The series belong to the registry (it outlives this); the pointers here only name them.
// Thread-safety: the series are atomic; the scheduler thread and any caller may update them.
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_SCHEDULER_METRICS_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_SCHEDULER_METRICS_H_

#include "cluster/metrics.h"

namespace k3 {

// What the model steps cost: StepBudget's fit and where each step's time went.
struct SchedulerStepMetrics {
  // Registers the series in `registry`.
  explicit SchedulerStepMetrics(MetricsRegistry& registry);

  Gauge* fixed;
  Gauge* per_token;
  Gauge* target;
  Counter* ping_pong;
  Histogram* seconds;
  Histogram* compute;
  Histogram* moe_wait;
  Histogram* layer_moe_wait;
  Histogram* tokens;
};

// The requests' series, and the steps' in `step`.
struct SchedulerMetrics {
  // Registers the series in `registry`.
  explicit SchedulerMetrics(MetricsRegistry& registry);

  MetricFamily<Counter>& requests;
  Counter* rejected;
  Counter* prompt_tokens;
  Counter* generated_tokens;
  Gauge* active;
  Gauge* cached;
  Gauge* state_bytes;
  Histogram* time_to_first_token;
  Histogram* inter_token;
  Histogram* request_seconds;
  SchedulerStepMetrics step;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_SCHEDULER_METRICS_H_
