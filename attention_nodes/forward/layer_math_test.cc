#include "attention_nodes/forward/layer_math.h"

#include <cmath>
#include <limits>
#include <vector>

#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using mixer_test::AllClose;
using mixer_test::RandomWeights;

TEST(ExpTest, MatchesLibmAcrossTheRange) {
  std::vector<float> x;
  for (float v = -90.0f; v <= 89.0f; v += 0.173f) x.push_back(v);
  x.push_back(0.0f);
  std::vector<float> y = x;
  ExpInPlace(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    if (x[i] < -87.33f) {
      EXPECT_EQ(y[i], 0.0f) << x[i];  // below the normal range: flushed to zero
    } else if (x[i] > 88.72f) {
      EXPECT_EQ(y[i], std::numeric_limits<float>::infinity()) << x[i];
    } else {
      EXPECT_NEAR(y[i], expected, 4e-7 * expected) << x[i];
    }
  }
}

TEST(ExpTest, SpecialValues) {
  std::vector<float> x = {-std::numeric_limits<float>::infinity(), 0.0f,
                          std::numeric_limits<float>::quiet_NaN()};
  ExpInPlace(x.data(), 3);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], 1.0f);
  EXPECT_TRUE(std::isnan(x[2]));
}

TEST(ActivationTest, SiluAndGateMatchFormulas) {
  RandomWeights rnd(1);
  std::vector<float> x = rnd.Normal(37, 0.0f, 4.0f), gate = rnd.Normal(37, 0.0f, 4.0f);
  std::vector<double> silu, gated;
  for (size_t i = 0; i < x.size(); ++i) {
    silu.push_back(x[i] / (1.0 + std::exp(-static_cast<double>(x[i]))));
    gated.push_back(x[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))));
  }
  std::vector<float> y = x;
  SiluInPlace(y.data(), 37);
  EXPECT_TRUE(AllClose(y, silu, 1e-6));
  y = x;
  MulSigmoid(gate.data(), y.data(), 37);
  EXPECT_TRUE(AllClose(y, gated, 1e-6));
}

TEST(VectorTest, ScaleMulAddOnOddLengths) {
  RandomWeights rnd(2);
  for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 200}) {
    std::vector<float> a = rnd.Normal(n, 0.0f, 1.0f), b = rnd.Normal(n, 0.0f, 1.0f);
    std::vector<double> scaled(n), muladd(n);
    for (int64_t i = 0; i < n; ++i) {
      scaled[i] = 3.0 * a[i];
      muladd[i] = b[i] + static_cast<double>(a[i]) * a[i];
    }
    std::vector<float> y = a;
    Scale(3.0f, y.data(), n);
    EXPECT_TRUE(AllClose(y, scaled, 1e-7)) << n;
    y = b;
    MulAdd(a.data(), a.data(), y.data(), n);
    EXPECT_TRUE(AllClose(y, muladd, 1e-6)) << n;
  }
}

// The online softmax's pieces against plain loops, on lengths around the vector width and with
// masked (-inf) entries.
TEST(VectorTest, MaxOfAndExpShiftedSumMatchPlainLoops) {
  RandomWeights rnd(4);
  EXPECT_EQ(MaxOf(nullptr, 0), -std::numeric_limits<float>::infinity());
  for (int64_t n : {1, 15, 16, 17, 64, 70}) {
    std::vector<float> x = rnd.Normal(n, 0.0f, 3.0f);
    if (n > 1) x[n / 2] = -std::numeric_limits<float>::infinity();  // not all masked
    if (n > 2) x[n - 1] = 7.5f;  // the maximum in the scalar tail
    float best = -std::numeric_limits<float>::infinity();
    for (float v : x) best = std::max(best, v);
    EXPECT_EQ(MaxOf(x.data(), n), best) << n;
    std::vector<double> expected(n);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      expected[i] = std::exp(static_cast<double>(x[i]) - best);
      total += expected[i];
    }
    const float sum = ExpShiftedSum(x.data(), n, best);
    EXPECT_NEAR(sum, total, 1e-6 * total) << n;
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], expected[i], 1e-6) << n << " " << i;
  }
}

TEST(NormTest, L2NormalizeHasEpsilonInsideTheRoot) {
  std::vector<float> x = {3e-4f, 4e-4f};  // Σx² = 2.5e-7, comparable to the 1e-6 ε
  L2NormalizeInPlace(x.data(), 2, 2.0f);
  const double inv = 2.0 / std::sqrt(2.5e-7 + 1e-6);
  EXPECT_NEAR(x[0], 3e-4 * inv, 1e-6);
  EXPECT_NEAR(x[1], 4e-4 * inv, 1e-6);
}

TEST(ScratchTest, BuffersGrowOnlyAndStayDistinct) {
  Scratch scratch;
  float* a = scratch.Get(0, 100);
  float* b = scratch.Get(3, 50);
  EXPECT_NE(a, b);
  EXPECT_EQ(scratch.Get(0, 80), a);  // smaller request: same buffer, no allocation
  EXPECT_GE(scratch.ByteSize(), 150 * sizeof(float));
  a[99] = 1.0f;
  b[49] = 2.0f;
  EXPECT_EQ(scratch.Get(0, 100)[99], 1.0f);
}

}  // namespace
}  // namespace k3
