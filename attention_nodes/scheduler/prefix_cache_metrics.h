// The prefix cache's Prometheus series: k3_attention_prefix_cache_lookups_total,
// _hits_total, _lookup_tokens_total, _hit_tokens_total (so the token hit rate is
// hit_tokens / lookup_tokens), _evictions_total, and the gauges _bytes, _blocks, _snapshots.
//
// Thread-safety: Update from one thread (the scheduler's); the series are read by the metrics
// endpoint's threads (atomic values).
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_METRICS_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_METRICS_H_

#include "attention_nodes/scheduler/prefix_cache.h"
#include "cluster/metrics.h"

namespace k3 {

class PrefixCacheMetrics {
 public:
  explicit PrefixCacheMetrics(MetricsRegistry& registry);

  // Brings the series to `stats` (the counters advance by what changed since the last call).
  void Update(const PrefixCacheStats& stats);

 private:
  Counter* lookups_;
  Counter* hits_;
  Counter* lookup_tokens_;
  Counter* hit_tokens_;
  Counter* evictions_;
  Gauge* bytes_;
  Gauge* blocks_;
  Gauge* snapshots_;
  PrefixCacheStats last_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_PREFIX_CACHE_METRICS_H_
