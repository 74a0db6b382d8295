#include "router/router_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

bool HasSample(const std::string& text, const std::string& sample) {
  return text.find(absl::StrCat("\n", sample, "\n")) != std::string::npos ||
         text.rfind(absl::StrCat(sample, "\n"), 0) == 0;
}

TEST(RouterMetricsTest, RoutedTokensPerLayerAndPerExpert) {
  MetricsRegistry registry;
  RouterMetrics metrics(&registry, /*per_expert_ids=*/4);
  // Layer 1: 3 tokens, top-2: experts 0,2 / 2,3 / 2,0.
  metrics.CountRouted(1, 3, 0.5, {0, 2, 2, 3, 2, 0});
  metrics.CountRouted(0, 1, 0.25, {1, 3});
  const std::string text = registry.ExpositionText();
  EXPECT_TRUE(HasSample(text, "k3_router_routed_tokens_total{layer=\"1\"} 3")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_routed_tokens_total{layer=\"0\"} 1")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_expert_load_max_vio{layer=\"1\"} 0.5")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_expert_routed_tokens_total{expert=\"0\"} 2")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_expert_routed_tokens_total{expert=\"1\"} 1")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_expert_routed_tokens_total{expert=\"2\"} 3")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_expert_routed_tokens_total{expert=\"3\"} 2")) << text;
}

TEST(RouterMetricsTest, PerExpertSeriesAreOptIn) {
  MetricsRegistry registry;
  RouterMetrics metrics(&registry, /*per_expert_ids=*/0);
  metrics.CountRouted(0, 1, 0, {1, 3});
  EXPECT_EQ(registry.ExpositionText().find("k3_router_expert_routed_tokens_total"),
            std::string::npos);
}

TEST(RouterMetricsTest, AnswersByCodeAndWhereTheirTimeWent) {
  MetricsRegistry registry;
  RouterMetrics metrics(&registry, 0);
  metrics.CountAnswer(absl::StatusCode::kOk, absl::Milliseconds(2));
  metrics.CountAnswer(absl::StatusCode::kOk, absl::Milliseconds(3));
  metrics.CountAnswer(absl::StatusCode::kUnavailable, absl::Seconds(5));
  metrics.ObserveAnswered(absl::Milliseconds(1), absl::Milliseconds(4));
  metrics.SetPending(7);
  const std::string text = registry.ExpositionText();
  EXPECT_TRUE(HasSample(text, "k3_router_steps_total{code=\"OK\"} 2")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_steps_total{code=\"UNAVAILABLE\"} 1")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_step_seconds_count 3")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_step_seconds_sum 5.005")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_step_compute_seconds_sum 0.001")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_step_expert_wait_seconds_sum 0.004")) << text;
  EXPECT_TRUE(HasSample(text, "k3_router_pending_steps 7")) << text;
}

}  // namespace
}  // namespace k3
