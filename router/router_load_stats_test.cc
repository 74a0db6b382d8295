#include "router/router_load_stats.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr int kExperts = 8;
constexpr int kTopK = 2;

// `tokens` random sigmoid scores routed with `bias` the way the gate does it.
Routing RandomRouting(int64_t tokens, const std::vector<float>& bias, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> score(0.f, 1.f);
  Routing routing;
  routing.tokens = tokens;
  routing.top_k = kTopK;
  routing.num_experts = kExperts;
  routing.scores.resize(tokens * kExperts);
  for (float& s : routing.scores) s = score(rng);
  routing.experts.resize(tokens * kTopK);
  routing.weights.resize(tokens * kTopK);
  for (int64_t t = 0; t < tokens; ++t) {
    SelectExperts(&routing.scores[t * kExperts], bias.data(), kExperts, kTopK, true, 1.f,
                  &routing.experts[t * kTopK], &routing.weights[t * kTopK]);
  }
  return routing;
}

TEST(RouterLoadStatsTest, CountsTokensPerExpertPerLayerAndResets) {
  const std::vector<std::vector<float>> bias(2, std::vector<float>(kExperts, 0.f));
  absl::StatusOr<std::unique_ptr<RouterLoadStats>> stats =
      RouterLoadStats::Create(kExperts, kTopK, bias, /*qb_bins=*/0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  Routing a = RandomRouting(50, bias[0], 1);
  Routing b = RandomRouting(30, bias[1], 2);
  (*stats)->Record(1, a);
  (*stats)->Record(1, b);
  std::vector<uint64_t> expected(kExperts, 0);
  for (int32_t e : a.experts) ++expected[e];
  for (int32_t e : b.experts) ++expected[e];

  const uint64_t max = *std::max_element(expected.begin(), expected.end());
  const double mean = 80.0 * kTopK / kExperts;
  EXPECT_NEAR((*stats)->MaxVio(1), (max - mean) / mean, 1e-12);

  k3serve::cluster::v1::LoadStatsResponse snapshot = (*stats)->Snapshot(/*reset=*/true, 7);
  EXPECT_EQ(snapshot.placement_version(), 7);
  EXPECT_EQ(snapshot.window_steps(), 2u);
  EXPECT_EQ(snapshot.window_tokens(), 80u);
  ASSERT_EQ(snapshot.layers_size(), 2);
  EXPECT_EQ(snapshot.layers(0).layer(), 0);
  EXPECT_EQ(std::vector<uint64_t>(snapshot.layers(0).counts().begin(),
                                  snapshot.layers(0).counts().end()),
            std::vector<uint64_t>(kExperts, 0));
  EXPECT_EQ(std::vector<uint64_t>(snapshot.layers(1).counts().begin(),
                                  snapshot.layers(1).counts().end()),
            expected);
  EXPECT_EQ(snapshot.layers(1).bins_size(), 0);
  EXPECT_EQ(snapshot.layers(1).top_k(), kTopK);
  EXPECT_EQ(snapshot.layers(1).bias_size(), kExperts);

  k3serve::cluster::v1::LoadStatsResponse after = (*stats)->Snapshot(false, 7);
  EXPECT_EQ(after.window_steps(), 0u);
  EXPECT_EQ(after.layers(1).counts(0), 0u);
  EXPECT_EQ((*stats)->MaxVio(1), 0.0);
}

// The QB histograms hold, per expert, r = α − s of every token (α: the (k+1)-th largest s + b),
// binned over [min(b) − 1, max(b) + 1]; checked against r computed here.
TEST(RouterLoadStatsTest, QbHistogramsBinEveryTokensMargin) {
  std::vector<float> bias(kExperts);
  for (int e = 0; e < kExperts; ++e) bias[e] = 0.05f * (e - 3);
  constexpr int kBins = 16;
  absl::StatusOr<std::unique_ptr<RouterLoadStats>> stats =
      RouterLoadStats::Create(kExperts, kTopK, {bias}, kBins);
  ASSERT_TRUE(stats.ok()) << stats.status();
  constexpr int64_t kTokens = 200;
  Routing routing = RandomRouting(kTokens, bias, 3);
  (*stats)->Record(0, routing);
  k3serve::cluster::v1::LoadStatsResponse snapshot = (*stats)->Snapshot(false, 1);
  const auto& layer = snapshot.layers(0);
  ASSERT_EQ(layer.bin_edges_size(), kBins);
  EXPECT_EQ(std::vector<float>(layer.bias().begin(), layer.bias().end()), bias);
  EXPECT_EQ(layer.top_k(), kTopK);
  ASSERT_EQ(layer.bins_size(), kExperts * kBins);
  const float lo = *std::min_element(bias.begin(), bias.end()) - 1.f;
  const float hi = *std::max_element(bias.begin(), bias.end()) + 1.f;
  EXPECT_NEAR(layer.bin_edges(kBins - 1), hi, 1e-6);
  EXPECT_NEAR(layer.bin_edges(0), lo + (hi - lo) / kBins, 1e-6);

  for (int e = 0; e < kExperts; ++e) {
    std::vector<double> r;
    for (int64_t t = 0; t < kTokens; ++t) {
      std::vector<float> choice(kExperts);
      for (int j = 0; j < kExperts; ++j) choice[j] = routing.scores[t * kExperts + j] + bias[j];
      std::sort(choice.begin(), choice.end(), std::greater<float>());
      r.push_back(static_cast<double>(choice[kTopK]) - routing.scores[t * kExperts + e]);
    }
    uint64_t cumulative = 0;
    for (int b = 0; b < kBins; ++b) {
      cumulative += layer.bins(e * kBins + b);
      const double edge = layer.bin_edges(b);
      // Values within rounding of an edge may land on either side; skip those edges.
      if (std::any_of(r.begin(), r.end(), [&](double v) { return std::abs(v - edge) < 1e-5; })) {
        continue;
      }
      const uint64_t below = std::count_if(r.begin(), r.end(), [&](double v) { return v <= edge; });
      EXPECT_EQ(cumulative, below) << "expert " << e << " edge " << b;
    }
    EXPECT_EQ(cumulative, static_cast<uint64_t>(kTokens));
  }
}

// A new bias (online bias) restarts the layer's window under it; the other layers keep theirs.
TEST(RouterLoadStatsTest, ANewBiasRestartsTheLayersWindowUnderThatBias) {
  const std::vector<std::vector<float>> bias(2, std::vector<float>(kExperts, 0.f));
  absl::StatusOr<std::unique_ptr<RouterLoadStats>> stats =
      RouterLoadStats::Create(kExperts, kTopK, bias, /*qb_bins=*/10);
  ASSERT_TRUE(stats.ok()) << stats.status();
  (*stats)->Record(0, RandomRouting(40, bias[0], 4));
  (*stats)->Record(1, RandomRouting(40, bias[1], 5));

  std::vector<float> pushed(kExperts, 0.f);
  pushed[2] = 0.5f;
  pushed[6] = -0.5f;
  (*stats)->SetBias(1, pushed);
  const Routing routing = RandomRouting(30, pushed, 6);
  (*stats)->Record(1, routing);
  std::vector<uint64_t> expected(kExperts, 0);
  for (int32_t e : routing.experts) ++expected[e];

  k3serve::cluster::v1::LoadStatsResponse snapshot = (*stats)->Snapshot(false, 1);
  const auto& layer = snapshot.layers(1);
  EXPECT_EQ(std::vector<float>(layer.bias().begin(), layer.bias().end()), pushed);
  EXPECT_EQ(std::vector<uint64_t>(layer.counts().begin(), layer.counts().end()), expected);
  uint64_t binned = 0;
  for (int b = 0; b < 10; ++b) binned += layer.bins(b);  // expert 0's histogram
  EXPECT_EQ(binned, 30u);
  EXPECT_NEAR(layer.bin_edges(9), 0.5 + 1, 1e-6);  // the range follows the new bias
  uint64_t kept = 0;
  for (uint64_t c : snapshot.layers(0).counts()) kept += c;
  EXPECT_EQ(kept, 40u * kTopK);
}

TEST(RouterLoadStatsTest, RejectsInconsistentShapes) {
  EXPECT_FALSE(RouterLoadStats::Create(kExperts, kTopK, {std::vector<float>(3)}, 0).ok());
  EXPECT_FALSE(RouterLoadStats::Create(kExperts, kExperts + 1, {}, 0).ok());
  EXPECT_FALSE(RouterLoadStats::Create(kExperts, kTopK, {}, -1).ok());
  // QB needs more experts than top_k.
  EXPECT_FALSE(
      RouterLoadStats::Create(kTopK, kTopK, {std::vector<float>(kTopK, 0.f)}, 10).ok());
}

}  // namespace
}  // namespace k3
