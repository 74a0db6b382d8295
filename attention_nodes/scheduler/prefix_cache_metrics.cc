#include "attention_nodes/scheduler/prefix_cache_metrics.h"

namespace k3 {

namespace {

Counter* NewCounter(MetricsRegistry& registry, const char* name, const char* help) {
  return registry.AddCounter(name, help).Get();
}

}  // namespace

PrefixCacheMetrics::PrefixCacheMetrics(MetricsRegistry& registry)
    : lookups_(NewCounter(registry, "k3_attention_prefix_cache_lookups_total",
                          "Admitted requests whose prompt was looked up in the prefix cache.")),
      hits_(NewCounter(registry, "k3_attention_prefix_cache_hits_total",
                       "Lookups that restored a cached prefix.")),
      lookup_tokens_(NewCounter(registry, "k3_attention_prefix_cache_lookup_tokens_total",
                                "Prompt tokens looked up in the prefix cache.")),
      hit_tokens_(NewCounter(registry, "k3_attention_prefix_cache_hit_tokens_total",
                             "Prompt tokens restored from the prefix cache (not prefilled).")),
      evictions_(NewCounter(registry, "k3_attention_prefix_cache_evictions_total",
                            "Prefix cache blocks evicted for its byte budget.")),
      bytes_(registry.AddGauge("k3_attention_prefix_cache_bytes",
                               "Bytes held by the prefix cache (MLA pages, KDA snapshots).")
                 .Get()),
      blocks_(registry.AddGauge("k3_attention_prefix_cache_blocks", "Token blocks cached.").Get()),
      snapshots_(registry
                     .AddGauge("k3_attention_prefix_cache_snapshots",
                               "KDA state snapshots held (block boundaries a hit can resume at).")
                     .Get()) {}

void PrefixCacheMetrics::Update(const PrefixCacheStats& stats) {
  lookups_->Increment(static_cast<double>(stats.lookups - last_.lookups));
  hits_->Increment(static_cast<double>(stats.hits - last_.hits));
  lookup_tokens_->Increment(static_cast<double>(stats.lookup_tokens - last_.lookup_tokens));
  hit_tokens_->Increment(static_cast<double>(stats.hit_tokens - last_.hit_tokens));
  evictions_->Increment(static_cast<double>(stats.evictions - last_.evictions));
  bytes_->Set(static_cast<double>(stats.bytes));
  blocks_->Set(static_cast<double>(stats.nodes));
  snapshots_->Set(static_cast<double>(stats.snapshots));
  last_ = stats;
}

}  // namespace k3
