#include "coordinator/coordinator_load.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "coordinator/expert_placement_planner.h"
#include "gtest/gtest.h"
#include "moe/qb_statistics.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr int kExperts = 8;
constexpr int kTopK = 2;
constexpr int kBins = 200;
const absl::Time kStart = absl::FromUnixSeconds(1700000000);

// Sigmoid scores where expert j leans by lean[j]; a fresh batch per call.
std::vector<float> Scores(int64_t tokens, const std::vector<double>& lean, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> s(tokens * lean.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < lean.size(); ++j) {
      s[t * lean.size() + j] = static_cast<float>(1.0 / (1.0 + std::exp(-(lean[j] + normal(rng)))));
    }
  }
  return s;
}

// One router's wire window of a layer, encoded as router/router_load_stats.h describes it.
pb::LayerLoadStats Encode(const QbLayerStatistics& qb) {
  pb::LayerLoadStats out;
  out.set_layer(qb.layer());
  out.set_top_k(qb.top_k());
  out.mutable_counts()->Add(qb.loads().begin(), qb.loads().end());
  out.mutable_bins()->Add(qb.data().counts.begin(), qb.data().counts.end());
  for (int b = 1; b <= qb.bins(); ++b) out.add_bin_edges(qb.range_lo() + b * qb.bin_width());
  out.mutable_bias()->Add(qb.data().bias.begin(), qb.data().bias.end());
  return out;
}

const std::vector<double> kLean = {1.5, 1.0, 0, 0, 0, 0, -0.5, 0};
const std::vector<float> kBias = {0.02f, -0.01f, 0.03f, 0.0f, -0.04f, 0.01f, 0.0f, -0.02f};

TEST(LoadWindowTest, TwoRoutersMergeToTheStatisticsOfAllTheirTokens) {
  std::mt19937_64 rng(5);
  const std::vector<float> a = Scores(700, kLean, rng);
  const std::vector<float> b = Scores(500, kLean, rng);
  // The independent path: one statistics object that saw every token.
  QbLayerStatistics all = *QbLayerStatistics::Create(1, kTopK, kBias, kBins);
  all.Record(a.data(), 700);
  all.Record(b.data(), 500);

  LoadWindow window(2, kExperts, kStart);
  for (const std::vector<float>* scores : {&a, &b}) {
    QbLayerStatistics one = *QbLayerStatistics::Create(1, kTopK, kBias, kBins);
    one.Record(scores->data(), static_cast<int64_t>(scores->size() / kExperts));
    pb::LoadStatsResponse response;
    *response.add_layers() = Encode(one);
    ASSERT_TRUE(window.Add(response).ok());
  }
  EXPECT_EQ(window.tokens(1), 1200u);
  EXPECT_EQ(window.tokens(0), 0u);
  ASSERT_NE(window.qb(1), nullptr);
  EXPECT_EQ(window.qb(1)->data().counts, all.data().counts);

  const ClusterPlacement placement{*ContiguousPlacement(2, kExperts, {4, 4}, 3), {11, 12}};
  const pb::LoadReport report = window.Report(placement);
  EXPECT_EQ(report.placement_version(), 3);
  EXPECT_EQ(report.window_start_unix_ms(), absl::ToUnixMillis(kStart));
  ASSERT_EQ(report.layers_size(), 2);
  const pb::LayerLoadReport& layer = report.layers(1);
  EXPECT_EQ(layer.tokens(), 1200u);
  ASSERT_EQ(layer.expert_loads_size(), kExperts);
  const std::vector<uint64_t> loads(layer.expert_loads().begin(), layer.expert_loads().end());
  EXPECT_EQ(loads, all.loads());
  EXPECT_DOUBLE_EQ(layer.expert_max_vio(), MaxVio(all.loads()));

  // Worker 0 holds experts 0-3, worker 1 experts 4-7.
  double w0 = 0, w1 = 0;
  for (int e = 0; e < kExperts; ++e) (e < 4 ? w0 : w1) += static_cast<double>(all.loads()[e]);
  ASSERT_EQ(layer.worker_loads_size(), 2);
  EXPECT_DOUBLE_EQ(layer.worker_loads(0), w0);
  EXPECT_DOUBLE_EQ(layer.worker_loads(1), w1);
  const double mean = (w0 + w1) / 2;
  EXPECT_NEAR(layer.worker_max_vio(), (std::max(w0, w1) - mean) / mean, 1e-12);
  EXPECT_NEAR(report.worker_max_vio(), layer.worker_max_vio() / 2, 1e-12);  // layer 0 has none

  // The QB estimate: the centred k/N quantiles, within a bin of the exact per-token quantiles.
  std::vector<float> scores = a;
  scores.insert(scores.end(), b.begin(), b.end());
  const std::vector<float> exact =
      CenterBias(ExactQbBias(scores.data(), 1200, kExperts, kTopK, kBias));
  ASSERT_EQ(layer.qb_bias_size(), kExperts);
  double sum = 0;
  for (int e = 0; e < kExperts; ++e) {
    EXPECT_NEAR(layer.qb_bias(e), exact[e], 2 * all.bin_width()) << "expert " << e;
    sum += layer.qb_bias(e);
  }
  EXPECT_NEAR(sum, 0, 1e-5);
  EXPECT_TRUE(report.layers(0).qb_bias().empty());
}

TEST(LoadWindowTest, RoutersUnderDifferentBiasesGiveLoadsButNoQbEstimate) {
  std::mt19937_64 rng(9);
  LoadWindow window(1, kExperts, kStart);
  std::vector<float> other_bias = kBias;
  other_bias[3] += 0.001f;
  uint64_t tokens = 0;
  for (const std::vector<float>& bias : {kBias, other_bias}) {
    const std::vector<float> s = Scores(300, kLean, rng);
    QbLayerStatistics one = *QbLayerStatistics::Create(0, kTopK, bias, kBins);
    one.Record(s.data(), 300);
    tokens += one.tokens();
    pb::LoadStatsResponse response;
    *response.add_layers() = Encode(one);
    ASSERT_TRUE(window.Add(response).ok());
  }
  EXPECT_EQ(window.tokens(0), tokens);
  EXPECT_EQ(window.qb(0), nullptr);
  EXPECT_TRUE(window.Report(ClusterPlacement()).layers(0).qb_bias().empty());
}

TEST(LoadWindowTest, LoadsWithoutHistogramsCountTokensByTopK) {
  LoadWindow window(1, 4, kStart);
  pb::LoadStatsResponse response;
  pb::LayerLoadStats* layer = response.add_layers();
  layer->set_top_k(2);
  for (uint64_t c : {10, 30, 0, 20}) layer->add_counts(c);
  ASSERT_TRUE(window.Add(response).ok());
  ASSERT_TRUE(window.Add(response).ok());
  EXPECT_EQ(window.tokens(0), 60u);
  EXPECT_EQ(window.ExpertLoads(), (std::vector<std::vector<double>>{{20, 60, 0, 40}}));
  const pb::LoadReport report = window.Report(ClusterPlacement());  // unplaced: no worker loads
  EXPECT_TRUE(report.layers(0).worker_loads().empty());
  EXPECT_DOUBLE_EQ(report.layers(0).expert_max_vio(), (60.0 - 30.0) / 30.0);

  window.Reset(kStart + absl::Seconds(1));
  EXPECT_EQ(window.total_tokens(), 0u);
  EXPECT_EQ(window.ExpertLoads(), (std::vector<std::vector<double>>{{0, 0, 0, 0}}));
  EXPECT_EQ(window.start(), kStart + absl::Seconds(1));
}

TEST(LoadWindowTest, RejectsAnswersThatDoNotFitAndAddsNothingFromThem) {
  std::mt19937_64 rng(3);
  const std::vector<float> s = Scores(50, kLean, rng);
  QbLayerStatistics qb = *QbLayerStatistics::Create(0, kTopK, kBias, kBins);
  qb.Record(s.data(), 50);
  const pb::LayerLoadStats good = Encode(qb);

  auto with = [&](const std::function<void(pb::LoadStatsResponse&)>& edit) {
    pb::LoadStatsResponse response;
    pb::LayerLoadStats* first = response.add_layers();
    *first = good;
    first->set_layer(1);  // a valid layer that must not be added when another is bad
    *response.add_layers() = good;
    edit(response);
    return response;
  };
  const std::vector<std::pair<const char*, pb::LoadStatsResponse>> bad = {
      {"layer out of range", with([](auto& r) { r.mutable_layers(1)->set_layer(2); })},
      {"layer twice", with([](auto& r) { r.mutable_layers(1)->set_layer(1); })},
      {"counts per expert", with([](auto& r) { r.mutable_layers(1)->add_counts(1); })},
      {"top_k", with([](auto& r) { r.mutable_layers(1)->set_top_k(kExperts + 1); })},
      {"loads not a multiple of top_k",
       with([](auto& r) { r.mutable_layers(1)->set_counts(0, r.layers(1).counts(0) + 1); })},
      {"histogram size", with([](auto& r) { r.mutable_layers(1)->add_bins(0); })},
      {"bias size", with([](auto& r) { r.mutable_layers(1)->add_bias(0); })},
      {"histogram total", with([](auto& r) {
         r.mutable_layers(1)->set_bins(kBins + 3, r.layers(1).bins(kBins + 3) + 1);
       })},
  };
  LoadWindow window(2, kExperts, kStart);
  for (const auto& [what, response] : bad) {
    const absl::Status status = window.Add(response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
    EXPECT_EQ(window.total_tokens(), 0u) << what;
  }
  ASSERT_TRUE(window.Add(with([](auto&) {})).ok());
  EXPECT_EQ(window.tokens(0), 50u);
  EXPECT_EQ(window.tokens(1), 50u);
}

}  // namespace
}  // namespace k3
