#include "router/gate.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Brute force: sort all experts by (choice desc, id asc).
std::vector<int32_t> SlowTopK(const std::vector<float>& s, const std::vector<float>& b, int k) {
  std::vector<int32_t> ids(s.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t x, int32_t y) { return s[x] + b[x] > s[y] + b[y]; });
  ids.resize(k);
  return ids;
}

TEST(GateTest, SelectionMatchesFullSortAndWeightsIgnoreBias) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.01f, 0.99f), small(-0.05f, 0.05f);
  const int kExperts = 32, kTopK = 4;
  int bias_changed_selection = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> scores(kExperts), bias(kExperts), zero(kExperts, 0.f);
    for (float& s : scores) s = unit(rng);
    for (float& b : bias) b = small(rng);
    std::vector<int32_t> ids(kTopK), plain_ids(kTopK);
    std::vector<float> weights(kTopK), plain_weights(kTopK);
    SelectExperts(scores.data(), bias.data(), kExperts, kTopK, true, 2.5f, ids.data(),
                  weights.data());
    SelectExperts(scores.data(), nullptr, kExperts, kTopK, true, 2.5f, plain_ids.data(),
                  plain_weights.data());
    EXPECT_EQ(ids, SlowTopK(scores, bias, kTopK));
    EXPECT_EQ(plain_ids, SlowTopK(scores, zero, kTopK));
    // Weights are the raw scores renormalized over the chosen set, then scaled (spec §12.4 #6).
    float sum = 0.f;
    for (int32_t id : ids) sum += scores[id];
    for (int s = 0; s < kTopK; ++s) EXPECT_NEAR(weights[s], 2.5f * scores[ids[s]] / sum, 1e-6f);
    bias_changed_selection += ids != plain_ids;
  }
  EXPECT_GT(bias_changed_selection, 20);  // the bias matters at this scale
}

TEST(GateTest, TiesGoToTheLowerExpertId) {
  std::vector<float> scores = {0.5f, 0.7f, 0.7f, 0.1f, 0.7f};
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  SelectExperts(scores.data(), nullptr, 5, 2, true, 1.f, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
}

TEST(GateTest, NoRenormalizationKeepsRawScores) {
  std::vector<float> scores = {0.2f, 0.9f, 0.4f};
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  SelectExperts(scores.data(), nullptr, 3, 2, false, 1.f, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(weights[0], 0.9f);
  EXPECT_FLOAT_EQ(weights[1], 0.4f);
}

}  // namespace
}  // namespace k3
