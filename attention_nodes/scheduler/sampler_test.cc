#include "attention_nodes/scheduler/sampler.h"

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(SamplerTest, TemperatureZeroIsArgmax) {
  std::vector<float> logits = {0.1f, 2.0f, -1.f, 1.9f};
  Sampler sampler(SamplingOptions{});
  EXPECT_EQ(sampler.Next(logits.data(), 4), 1);
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  std::vector<float> logits = {0.1f, 2.0f, -1.f, 1.9f};
  Sampler sampler(SamplingOptions{1.5f, 1.f, 1, 42});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.Next(logits.data(), 4), 1);
}

TEST(SamplerTest, SameSeedSameDraws) {
  std::vector<float> logits = {0.f, 0.5f, 1.f, 0.2f, -0.3f};
  Sampler a(SamplingOptions{1.f, 1.f, 0, 9}), b(SamplingOptions{1.f, 1.f, 0, 9});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Next(logits.data(), 5), b.Next(logits.data(), 5));
}

// Frequencies follow softmax(logits / T), and top_p drops the tail: with probabilities
// {0.5, 0.3, 0.2}, top_p = 0.7 keeps the first two, renormalized to {0.625, 0.375}.
TEST(SamplerTest, FrequenciesFollowSoftmaxAndTopP) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const int kDraws = 20000;
  Sampler full(SamplingOptions{1.f, 1.f, 0, 1});
  Sampler nucleus(SamplingOptions{1.f, 0.7f, 0, 1});
  std::map<int, int> full_counts, nucleus_counts;
  for (int i = 0; i < kDraws; ++i) {
    ++full_counts[full.Next(logits.data(), 3)];
    ++nucleus_counts[nucleus.Next(logits.data(), 3)];
  }
  EXPECT_NEAR(full_counts[0] / double(kDraws), 0.5, 0.02);
  EXPECT_NEAR(full_counts[1] / double(kDraws), 0.3, 0.02);
  EXPECT_NEAR(full_counts[2] / double(kDraws), 0.2, 0.02);
  EXPECT_EQ(nucleus_counts[2], 0);
  EXPECT_NEAR(nucleus_counts[0] / double(kDraws), 0.625, 0.02);
}

TEST(SamplerTest, RejectsBadOptions) {
  EXPECT_FALSE(ValidateSamplingOptions(SamplingOptions{-1.f, 1.f, 0, 0}).ok());
  EXPECT_FALSE(ValidateSamplingOptions(SamplingOptions{1.f, 0.f, 0, 0}).ok());
  EXPECT_FALSE(ValidateSamplingOptions(SamplingOptions{1.f, 1.5f, 0, 0}).ok());
  EXPECT_FALSE(ValidateSamplingOptions(SamplingOptions{1.f, 1.f, -2, 0}).ok());
  EXPECT_TRUE(ValidateSamplingOptions(SamplingOptions{0.7f, 0.9f, 40, 0}).ok());
}

TEST(SamplerTest, NonFiniteLogitsAreAnInternalError) {
  std::vector<float> logits = {0.5f, -2.f, 3.f, 1.f};
  EXPECT_TRUE(CheckLogitsFinite(logits.data(), 4).ok());
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, size_t{3}}) {
      std::vector<float> row = logits;
      row[at] = bad;
      EXPECT_EQ(CheckLogitsFinite(row.data(), 4).code(), absl::StatusCode::kInternal)
          << bad << " at " << at;
    }
  }
}

// Log-probabilities against log(softmax) computed here in long double, term by term.
TEST(SamplerTest, LogprobsAreTheRawDistributionsLogSoftmax) {
  const std::vector<float> logits = {0.25f, 3.f, -2.f, 3.f, 1.5f, -0.75f};
  long double z = 0;
  for (float l : logits) z += std::exp(static_cast<long double>(l));
  auto expected = [&](int id) { return static_cast<double>(logits[id] - std::log(z)); };
  const TokenLogprobs lp = LogprobsOf(logits.data(), logits.size(), 4, 3);
  EXPECT_NEAR(lp.logprob, expected(4), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  // Most likely first; the tie between ids 1 and 3 goes to the lower id.
  const int order[] = {1, 3, 4};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lp.top[i].first, order[i]);
    EXPECT_NEAR(lp.top[i].second, expected(order[i]), 1e-6);
  }
  EXPECT_TRUE(LogprobsOf(logits.data(), logits.size(), 0, 0).top.empty());
  EXPECT_EQ(LogprobsOf(logits.data(), logits.size(), 0, 100).top.size(), logits.size());
}

}  // namespace
}  // namespace k3
