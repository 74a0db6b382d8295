#include "moe/qb_statistics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Scores σ(μ_j + σ_z z) with z standard normal: expert j's mean preference μ_j makes the
// distribution skewed; every call draws a fresh batch.
class SkewedScores {
 public:
  SkewedScores(int num_experts, double skew, uint64_t seed) : mu_(num_experts), rng_(seed) {
    for (int j = 0; j < num_experts; ++j) {
      double x = static_cast<double>(j) / (num_experts - 1);
      mu_[j] = skew * (x * x - 0.5);
    }
  }
  std::vector<float> Draw(int64_t tokens) {
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<float> s(tokens * mu_.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (size_t j = 0; j < mu_.size(); ++j) {
        s[t * mu_.size() + j] =
            static_cast<float>(1.0 / (1.0 + std::exp(-(mu_[j] + normal(rng_)))));
      }
    }
    return s;
  }

 private:
  std::vector<double> mu_;
  std::mt19937_64 rng_;
};

// The slow path: every expert ranked by a full stable sort on s + b (stable keeps the lower id
// first among equals). Returns the ranking; α is the value of ranking[top_k].
std::vector<int32_t> FullRanking(const float* s, absl::Span<const float> bias) {
  std::vector<int32_t> order(bias.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return s[a] + bias[a] > s[b] + bias[b]; });
  return order;
}

std::vector<uint64_t> SlowLoads(const std::vector<float>& scores, int n, int k,
                                absl::Span<const float> bias) {
  std::vector<uint64_t> loads(n, 0);
  for (size_t t = 0; t < scores.size() / n; ++t) {
    std::vector<int32_t> order = FullRanking(&scores[t * n], bias);
    for (int c = 0; c < k; ++c) ++loads[order[c]];
  }
  return loads;
}

std::vector<float> SlowAlpha(const std::vector<float>& scores, int n, int k,
                             absl::Span<const float> bias) {
  std::vector<float> alpha(scores.size() / n);
  for (size_t t = 0; t < alpha.size(); ++t) {
    std::vector<int32_t> order = FullRanking(&scores[t * n], bias);
    alpha[t] = scores[t * n + order[k]] + bias[order[k]];
  }
  return alpha;
}

std::vector<float> RandomBias(int n, double spread, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-spread, spread);
  std::vector<float> b(n);
  for (float& x : b) x = static_cast<float>(uniform(rng));
  return b;
}

TEST(QbStatisticsTest, MaxVioOfHandValues) {
  std::vector<uint64_t> loads = {1, 2, 3};
  EXPECT_DOUBLE_EQ(MaxVio(loads), 0.5);  // mean 2, max 3
  std::vector<uint64_t> even = {7, 7, 7, 7};
  EXPECT_DOUBLE_EQ(MaxVio(even), 0.0);
  std::vector<uint64_t> zeros = {0, 0};
  EXPECT_DOUBLE_EQ(MaxVio(zeros), 0.0);
}

TEST(QbStatisticsTest, Type7MatchesTheDefinition) {
  // numpy.quantile([1, 2, 3, 4], q) with the default linear method: 1, 1.75, 2.5, 4.
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Type7Quantile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(Type7Quantile(v, 0.25), 1.75);
  EXPECT_DOUBLE_EQ(Type7Quantile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Type7Quantile(v, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(Type7Quantile({5.0}, 0.3), 5.0);
}

TEST(QbStatisticsTest, CenterBiasRemovesTheMeanOnly) {
  std::vector<float> b = {0.5f, -0.25f, 1.0f, 0.75f};  // mean 0.5
  std::vector<float> c = CenterBias(b);
  ASSERT_EQ(c.size(), b.size());
  EXPECT_FLOAT_EQ(c[0], 0.0f);
  EXPECT_FLOAT_EQ(c[1], -0.75f);
  EXPECT_FLOAT_EQ(c[2], 0.5f);
  EXPECT_FLOAT_EQ(c[3], 0.25f);
}

TEST(QbStatisticsTest, HistogramQuantileInterpolatesInsideTheHitBin) {
  // Two experts, k = 1: the median. Bias 0: range [-1, 1], 4 bins of width 0.5.
  QbLayerStatisticsData data;
  data.layer = 3;
  data.top_k = 1;
  data.bins = 4;
  data.bias = {0.0f, 0.0f};
  data.tokens = 4;
  data.loads = {2, 2};
  data.counts = {0, 2, 2, 0,   // expert 0: cumulative 2 reached at the end of bin 1 -> edge 0.0
                 1, 0, 0, 3};  // expert 1: 1 before bin 3, needs 1 of its 3 -> 0.5 + 0.5/3
  auto stats = QbLayerStatistics::FromData(data);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto estimate = stats->EstimateBias();
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  EXPECT_NEAR((*estimate)[0], 0.0, 1e-6);
  EXPECT_NEAR((*estimate)[1], 0.5 + 0.5 / 3, 1e-6);
}

TEST(QbStatisticsTest, RecordMatchesSlowRoutingAndBinning) {
  const int n = 16, k = 4, bins = 50;
  const int64_t tokens = 1000;
  std::vector<float> bias = RandomBias(n, 0.3, 1);
  std::vector<float> scores = SkewedScores(n, 2.0, 2).Draw(tokens);
  auto stats = QbLayerStatistics::Create(0, k, bias, bins);
  ASSERT_TRUE(stats.ok()) << stats.status();
  stats->Record(scores.data(), tokens);
  EXPECT_EQ(stats->tokens(), static_cast<uint64_t>(tokens));
  EXPECT_EQ(stats->loads(), SlowLoads(scores, n, k, bias));

  const float min_b = *std::min_element(bias.begin(), bias.end());
  const float max_b = *std::max_element(bias.begin(), bias.end());
  const double lo = min_b - 1.0, width = (max_b + 1.0 - lo) / bins;
  std::vector<float> alpha = SlowAlpha(scores, n, k, bias);
  const std::vector<uint64_t>& counts = stats->data().counts;
  for (int j = 0; j < n; ++j) {
    std::vector<double> r(tokens);
    for (int64_t t = 0; t < tokens; ++t) r[t] = alpha[t] - scores[t * n + j];
    // Values below each bin edge against the cumulative counts; a value within rounding of an
    // edge may fall on either side of it.
    uint64_t cumulative = 0;
    for (int b = 0; b < bins; ++b) {
      cumulative += counts[j * bins + b];
      const double edge = lo + width * (b + 1);
      int64_t below = 0, near = 0;
      for (double x : r) {
        below += x < edge;
        near += std::fabs(x - edge) < 1e-5;
      }
      EXPECT_LE(std::llabs(static_cast<int64_t>(cumulative) - below), near)
          << "expert " << j << " edge " << b;
    }
    EXPECT_EQ(cumulative, static_cast<uint64_t>(tokens));
  }
}

TEST(QbStatisticsTest, RecordRoutedWithTheRoutersChoiceEqualsRecord) {
  const int n = 24, k = 3;
  const int64_t tokens = 300;
  std::vector<float> bias = RandomBias(n, 0.2, 3);
  std::vector<float> scores = SkewedScores(n, 1.5, 4).Draw(tokens);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> order = FullRanking(&scores[t * n], bias);
    ids.insert(ids.end(), order.begin(), order.begin() + k);
  }
  auto routed = QbLayerStatistics::Create(0, k, bias, 100);
  auto recorded = QbLayerStatistics::Create(0, k, bias, 100);
  ASSERT_TRUE(routed.ok() && recorded.ok());
  routed->RecordRouted(scores.data(), ids.data(), tokens);
  recorded->Record(scores.data(), tokens);
  EXPECT_EQ(routed->loads(), recorded->loads());
  EXPECT_EQ(routed->data().counts, recorded->data().counts);
}

TEST(QbStatisticsTest, MergedHistogramsEqualTheHistogramOfPooledTokens) {
  const int n = 32, k = 4;
  const int64_t tokens = 2000;
  std::vector<float> bias = RandomBias(n, 0.5, 5);
  std::vector<float> scores = SkewedScores(n, 3.0, 6).Draw(tokens);
  auto pooled = QbLayerStatistics::Create(7, k, bias);
  ASSERT_TRUE(pooled.ok());
  pooled->Record(scores.data(), tokens);

  // Three routers with uneven shares, merged in an order different from the token order.
  const int64_t cuts[] = {0, 333, 1500, tokens};
  std::vector<QbLayerStatistics> parts;
  for (int p = 0; p < 3; ++p) {
    auto part = QbLayerStatistics::Create(7, k, bias);
    ASSERT_TRUE(part.ok());
    part->Record(scores.data() + cuts[p] * n, cuts[p + 1] - cuts[p]);
    parts.push_back(*part);
  }
  QbLayerStatistics merged = parts[2];
  ASSERT_TRUE(merged.Merge(parts[0]).ok());
  ASSERT_TRUE(merged.Merge(parts[1]).ok());
  EXPECT_EQ(merged.tokens(), pooled->tokens());
  EXPECT_EQ(merged.loads(), pooled->loads());
  EXPECT_EQ(merged.data().counts, pooled->data().counts);
  auto a = merged.EstimateBias();
  auto b = pooled->EstimateBias();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);

  // The per-part quantiles, by contrast, do not average to the pooled one.
  double worst = 0;
  for (int j = 0; j < n; ++j) {
    double average = 0;
    for (const auto& part : parts) average += (*part.EstimateBias())[j] / 3.0;
    worst = std::max(worst, std::fabs(average - (*b)[j]));
  }
  EXPECT_GT(worst, merged.bin_width());
}

TEST(QbStatisticsTest, FlatDataRoundTripsAndIsChecked) {
  const int n = 8, k = 2;
  std::vector<float> bias = RandomBias(n, 0.1, 7);
  std::vector<float> scores = SkewedScores(n, 1.0, 8).Draw(100);
  auto stats = QbLayerStatistics::Create(2, k, bias, 20);
  ASSERT_TRUE(stats.ok());
  stats->Record(scores.data(), 100);
  auto copy = QbLayerStatistics::FromData(stats->data());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->data().counts, stats->data().counts);
  EXPECT_EQ(copy->loads(), stats->loads());
  EXPECT_EQ(copy->range_lo(), stats->range_lo());

  QbLayerStatisticsData bad = stats->data();
  bad.counts[5] += 1;  // one histogram now holds 101 values
  EXPECT_EQ(QbLayerStatistics::FromData(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = stats->data();
  bad.loads[0] += 1;
  EXPECT_EQ(QbLayerStatistics::FromData(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = stats->data();
  bad.counts.pop_back();
  EXPECT_EQ(QbLayerStatistics::FromData(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QbStatisticsTest, BadShapesAndMismatchedMergesAreRejected) {
  std::vector<float> bias(8, 0.0f);
  EXPECT_FALSE(QbLayerStatistics::Create(0, 8, bias).ok());  // top_k must be < num_experts
  EXPECT_FALSE(QbLayerStatistics::Create(0, 0, bias).ok());
  EXPECT_FALSE(QbLayerStatistics::Create(0, 2, bias, 0).ok());
  std::vector<float> nan_bias = bias;
  nan_bias[3] = NAN;
  EXPECT_FALSE(QbLayerStatistics::Create(0, 2, nan_bias).ok());

  auto a = QbLayerStatistics::Create(0, 2, bias);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->EstimateBias().status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> other_bias = bias;
  other_bias[0] = 0.01f;
  auto b = QbLayerStatistics::Create(0, 2, other_bias);
  auto c = QbLayerStatistics::Create(1, 2, bias);
  auto d = QbLayerStatistics::Create(0, 2, bias, 10);
  ASSERT_TRUE(b.ok() && c.ok() && d.ok());
  EXPECT_EQ(a->Merge(*b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Merge(*c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Merge(*d).code(), absl::StatusCode::kInvalidArgument);
}

// With every cutoff α_i held fixed, expert j wins token i iff s_ij + b_j > α_i, a step function
// W_j(b) of b. The type-7 k/N quantile puts W_j within one of (k/N) T wherever W_j steps by one.
// r[:, j] has one built-in tie, though: every token whose (k+1)-th expert is j itself has
// r_ij = α_i − s_ij = b_old_j. When the quantile lands on that tie the estimate stays at b_old_j
// and W_j jumps across the target there; then the target must lie inside the jump.
TEST(QbStatisticsTest, ExactEstimateGivesEveryExpertItsShareWithCutoffsFixed) {
  const int n = 16, k = 4;
  const int64_t tokens = 3001;  // k/N * T = 750.25
  std::vector<float> bias = RandomBias(n, 0.4, 9);
  std::vector<float> scores = SkewedScores(n, 3.0, 10).Draw(tokens);
  std::vector<float> estimate = ExactQbBias(scores.data(), tokens, n, k, bias);
  std::vector<float> alpha = SlowAlpha(scores, n, k, bias);  // the cutoffs under the old bias
  const double share = static_cast<double>(k) / n * tokens;
  auto wins = [&](int j, double b) {
    int64_t count = 0;
    for (int64_t t = 0; t < tokens; ++t) count += scores[t * n + j] + b > alpha[t];
    return count;
  };
  const double delta = 1e-5;
  int untied = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t below = wins(j, estimate[j] - delta), above = wins(j, estimate[j] + delta);
    if (above - below <= 1) {
      ++untied;
      EXPECT_LE(std::fabs(wins(j, estimate[j]) - share), 1.0) << "expert " << j;
    } else {
      EXPECT_NEAR(estimate[j], bias[j], delta) << "expert " << j << ": a tie other than b_old";
      EXPECT_LE(below, share + 1) << "expert " << j;
      EXPECT_GE(above, share - 1) << "expert " << j;
    }
  }
  EXPECT_GE(untied, 12);
  // The old bias was far from balanced: the test is not vacuous.
  EXPECT_GT(MaxVio(SlowLoads(scores, n, k, bias)), 0.5);
}

TEST(QbStatisticsTest, HistogramEstimateIsWithinOneBinOfTheExactOne) {
  const int n = 16, k = 2;
  const int64_t tokens = 20000;
  std::vector<float> bias = RandomBias(n, 0.3, 11);
  std::vector<float> scores = SkewedScores(n, 2.0, 12).Draw(tokens);
  std::vector<float> exact = ExactQbBias(scores.data(), tokens, n, k, bias);
  for (int bins : {1000, 64}) {
    auto stats = QbLayerStatistics::Create(0, k, bias, bins);
    ASSERT_TRUE(stats.ok());
    stats->Record(scores.data(), tokens);
    auto estimate = stats->EstimateBias();
    ASSERT_TRUE(estimate.ok());
    for (int j = 0; j < n; ++j) {
      EXPECT_LE(std::fabs((*estimate)[j] - exact[j]), stats->bin_width())
          << "expert " << j << ", " << bins << " bins";
    }
  }
}

TEST(QbStatisticsTest, RepeatedQbStepsDriveMaxVioDown) {
  // One fixed batch: each step routes with the current bias, moving every cutoff, so the balance
  // comes over several steps.
  const int n = 64, k = 8;
  const int64_t tokens = 4096;
  std::vector<float> scores = SkewedScores(n, 4.0, 13).Draw(tokens);
  std::vector<float> bias(n, 0.0f);
  std::vector<double> vio;
  for (int step = 0; step < 6; ++step) {
    vio.push_back(MaxVio(SlowLoads(scores, n, k, bias)));
    bias = CenterBias(ExactQbBias(scores.data(), tokens, n, k, bias));
  }
  vio.push_back(MaxVio(SlowLoads(scores, n, k, bias)));
  for (size_t s = 0; s < vio.size(); ++s) std::printf("step %zu: MaxVio %.4f\n", s, vio[s]);
  for (size_t s = 1; s < vio.size(); ++s) EXPECT_LT(vio[s], vio[s - 1]) << "step " << s;
  EXPECT_GT(vio[0], 1.0);
  EXPECT_LT(vio.back(), 0.05);
}

// The seed article's teaching experiment (chapter 6): a fixed skewed score distribution,
// resampled every step; each method routes the fresh batch with its current bias and then updates.
TEST(QbStatisticsTest, QbReachesLowerMaxVioThanSignSgd) {
  const int n = 64, k = 8, steps = 40;
  const int64_t tokens = 4096;
  const std::vector<double> step_sizes = {0.001, 0.003, 0.01, 0.03, 0.1};
  SkewedScores source(n, 4.0, 20260909);
  const double target = static_cast<double>(k) / n * tokens;
  std::vector<float> qb_exact(n, 0.0f), qb_hist(n, 0.0f);
  std::vector<std::vector<float>> sign(step_sizes.size(), std::vector<float>(n, 0.0f));
  // Mean MaxVio over the last half of the run, once the start-up transient is over.
  double tail_exact = 0, tail_hist = 0;
  std::vector<double> tail_sign(step_sizes.size(), 0.0);
  double largest_gap = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> scores = source.Draw(tokens);
    const bool tail = step >= steps / 2;
    double vio_exact = MaxVio(RouteLoads(scores.data(), tokens, n, k, qb_exact));
    auto stats = QbLayerStatistics::Create(0, k, qb_hist);
    ASSERT_TRUE(stats.ok());
    stats->Record(scores.data(), tokens);
    double vio_hist = stats->MaxVio();
    largest_gap = std::max(largest_gap, std::fabs(vio_exact - vio_hist));
    if (tail) tail_exact += vio_exact / (steps / 2), tail_hist += vio_hist / (steps / 2);
    qb_exact = CenterBias(ExactQbBias(scores.data(), tokens, n, k, qb_exact));
    qb_hist = CenterBias(*stats->EstimateBias());
    for (size_t u = 0; u < step_sizes.size(); ++u) {
      std::vector<uint64_t> loads = RouteLoads(scores.data(), tokens, n, k, sign[u]);
      if (tail) tail_sign[u] += MaxVio(loads) / (steps / 2);
      for (int j = 0; j < n; ++j) {
        double d = target - static_cast<double>(loads[j]);
        sign[u][j] += static_cast<float>(step_sizes[u] * ((d > 0) - (d < 0)));
      }
    }
  }
  std::printf("tail MaxVio: QB exact %.4f, QB 1000 bins %.4f (largest per-step gap %.4f)\n",
              tail_exact, tail_hist, largest_gap);
  for (size_t u = 0; u < step_sizes.size(); ++u) {
    std::printf("tail MaxVio: SignSGD u=%g %.4f\n", step_sizes[u], tail_sign[u]);
    EXPECT_LT(tail_exact, tail_sign[u]) << "u = " << step_sizes[u];
    EXPECT_LT(tail_hist, tail_sign[u]) << "u = " << step_sizes[u];
  }
}

}  // namespace
}  // namespace k3
