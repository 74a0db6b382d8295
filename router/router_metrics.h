// RouterMetrics: the router's Prometheus series (router_core.h's file comment lists them), kept
// in the registry given at construction. Thread-safe as the registry's metrics are; RouterCore
// calls it from its one thread.
#ifndef K3SERVE_ROUTER_ROUTER_METRICS_H_
#define K3SERVE_ROUTER_ROUTER_METRICS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/metrics.h"

namespace k3 {

class RouterMetrics {
 public:
  // `per_expert_ids` > 0 adds k3_router_expert_routed_tokens_total{expert} for that many expert
  // ids (opt-in: one series per expert). `registry` must outlive this.
  RouterMetrics(MetricsRegistry* registry, int per_expert_ids);

  // A step of MoE layer `moe_layer` went out: its tokens, the layer's max violation so far, and
  // the expert each (token, k) pair was routed to.
  void CountRouted(int moe_layer, int64_t tokens, double max_vio,
                   const std::vector<int32_t>& experts);
  // A step was answered with `code`, `since_arrival` after its MoeRequest came.
  void CountAnswer(absl::StatusCode code, absl::Duration since_arrival);
  // Where an answered step's time went: the router's compute and the wait for the experts.
  void ObserveAnswered(absl::Duration compute, absl::Duration expert_wait);
  void SetPending(size_t steps);

 private:
  MetricFamily<Counter>& steps_;
  Histogram* const step_seconds_;
  Histogram* const step_compute_;
  Histogram* const step_expert_wait_;
  Gauge* const pending_;
  MetricFamily<Counter>& tokens_;
  MetricFamily<Gauge>& max_vio_;
  std::vector<Counter*> expert_tokens_;  // by expert id; empty unless enabled
};

}  // namespace k3

#endif  // K3SERVE_ROUTER_ROUTER_METRICS_H_
