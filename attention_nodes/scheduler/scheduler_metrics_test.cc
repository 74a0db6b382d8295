#include "attention_nodes/scheduler/scheduler_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "cluster/metrics.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// Each member of SchedulerMetrics names the series its header lists: a distinct value written
// through the member shows up under that name in the exposition text.
TEST(SchedulerMetricsTest, EachMemberUpdatesTheSeriesItsHeaderNames) {
  MetricsRegistry registry;
  SchedulerMetrics metrics(registry);
  metrics.requests.WithLabels({"stop"})->Increment(1);
  metrics.rejected->Increment(2);
  metrics.prompt_tokens->Increment(3);
  metrics.generated_tokens->Increment(4);
  metrics.step.fixed->Set(5);
  metrics.step.per_token->Set(6);
  metrics.step.target->Set(7);
  metrics.step.ping_pong->Increment(8);
  metrics.active->Set(9);
  metrics.cached->Set(10);
  metrics.state_bytes->Set(11);
  const std::vector<std::pair<std::string, std::string>> scalars = {
      {"k3_attention_requests_total{finish_reason=\"stop\"}", "1"},
      {"k3_attention_rejected_requests_total", "2"},
      {"k3_attention_prompt_tokens_total", "3"},
      {"k3_attention_generated_tokens_total", "4"},
      {"k3_attention_step_fixed_seconds", "5"},
      {"k3_attention_step_per_token_seconds", "6"},
      {"k3_attention_step_target_seconds", "7"},
      {"k3_attention_ping_pong_steps_total", "8"},
      {"k3_attention_active_requests", "9"},
      {"k3_attention_cached_sequences", "10"},
      {"k3_attention_request_state_bytes", "11"},
  };
  // Histograms: the i-th gets i observations, so its _count tells which member fed it.
  const std::vector<std::pair<Histogram*, std::string>> histograms = {
      {metrics.step.seconds, "k3_attention_step_seconds"},
      {metrics.step.compute, "k3_attention_step_compute_seconds"},
      {metrics.step.moe_wait, "k3_attention_step_moe_wait_seconds"},
      {metrics.step.layer_moe_wait, "k3_attention_layer_moe_wait_seconds"},
      {metrics.step.tokens, "k3_attention_step_tokens"},
      {metrics.time_to_first_token, "k3_attention_time_to_first_token_seconds"},
      {metrics.inter_token, "k3_attention_inter_token_seconds"},
      {metrics.request_seconds, "k3_attention_request_seconds"},
  };
  for (size_t i = 0; i < histograms.size(); ++i) {
    for (size_t n = 0; n <= i; ++n) histograms[i].first->Observe(1.0);
  }
  const std::string text = "\n" + registry.ExpositionText();
  for (const auto& [series, value] : scalars) {
    EXPECT_NE(text.find("\n" + series + " " + value + "\n"), std::string::npos) << series;
  }
  for (size_t i = 0; i < histograms.size(); ++i) {
    const std::string& name = histograms[i].second;
    EXPECT_NE(text.find("\n# TYPE " + name + " histogram\n"), std::string::npos) << name;
    EXPECT_NE(text.find("\n" + name + "_count " + std::to_string(i + 1) + "\n"),
              std::string::npos)
        << name;
  }
}

}  // namespace
}  // namespace k3
