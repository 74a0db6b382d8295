#include "attention_nodes/layer_math.h"

#include <cmath>
#include <limits>
#include <vector>

#include "attention_nodes/test_weights.h"
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

TEST(VectorTest, DotAxpyScaleMulAddOnOddLengths) {
  RandomWeights rnd(2);
  for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 200}) {
    std::vector<float> a = rnd.Normal(n, 0.0f, 1.0f), b = rnd.Normal(n, 0.0f, 1.0f);
    double dot = 0;
    std::vector<double> axpy(n), scaled(n), muladd(n);
    for (int64_t i = 0; i < n; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      axpy[i] = b[i] + 0.5 * a[i];
      scaled[i] = 3.0 * a[i];
      muladd[i] = b[i] + static_cast<double>(a[i]) * a[i];
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), dot, 1e-5 * n) << n;
    std::vector<float> y = b;
    Axpy(0.5f, a.data(), y.data(), n);
    EXPECT_TRUE(AllClose(y, axpy, 1e-6)) << n;
    y = a;
    Scale(3.0f, y.data(), n);
    EXPECT_TRUE(AllClose(y, scaled, 1e-7)) << n;
    y = b;
    MulAdd(a.data(), a.data(), y.data(), n);
    EXPECT_TRUE(AllClose(y, muladd, 1e-6)) << n;
  }
}

// Every (row of a, row of b) pair against an fp64 dot product, for row counts around the
// four-row groups, vector tails and strides wider than the rows.
TEST(VectorTest, DotRowsMatchesEveryPairwiseDot) {
  RandomWeights rnd(3);
  for (int64_t m : {1, 3, 4, 5, 8, 9}) {
    for (int64_t n : {1, 15, 16, 80, 83}) {
      const int64_t k = 7, a_ld = n + 3, b_ld = n + 5, out_ld = k + 2;
      const std::vector<float> a = rnd.Normal(m * a_ld, 0.0f, 1.0f);
      const std::vector<float> b = rnd.Normal(k * b_ld, 0.0f, 1.0f);
      std::vector<float> out(m * out_ld, -1.0f);
      DotRows(a.data(), a_ld, m, b.data(), b_ld, k, n, out.data(), out_ld);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < out_ld; ++j) {
          if (j >= k) {
            EXPECT_EQ(out[i * out_ld + j], -1.0f) << "wrote past k";
            continue;
          }
          double expected = 0;
          for (int64_t d = 0; d < n; ++d) expected += double{a[i * a_ld + d]} * b[j * b_ld + d];
          EXPECT_NEAR(out[i * out_ld + j], expected, 1e-5 * (1 + std::abs(expected)))
              << "m " << m << " n " << n << " i " << i << " j " << j;
        }
      }
    }
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

TEST(GemmTest, MatchesNaiveProductWithTailsStridesAndAccumulation) {
  RandomWeights rnd(4);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {4, 32, 8}, {7, 45, 13}, {16, 128, 128}, {9, 70, 0}}) {
    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
    std::vector<float> a = rnd.Normal(m * lda, 0.0f, 1.0f),
                       b = rnd.Normal(std::max<int64_t>(k, 1) * ldb, 0.0f, 1.0f);
    std::vector<float> c0 = rnd.Normal(m * ldc, 0.0f, 1.0f);
    for (bool accumulate : {false, true}) {
      std::vector<float> c = c0;
      Gemm(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
      std::vector<double> expected(c0.begin(), c0.end());
      std::vector<float> actual = c;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = accumulate ? c0[i * ldc + j] : 0.0;
          for (int64_t kk = 0; kk < k; ++kk)
            sum += static_cast<double>(a[i * lda + kk]) * b[kk * ldb + j];
          expected[i * ldc + j] = sum;
        }
      }
      EXPECT_TRUE(AllClose(actual, expected, 1e-5)) << m << "x" << n << "x" << k;
    }
  }
}

TEST(MatMulTransposedTest, MatchesNaiveForBothWeightTypes) {
  RandomWeights rnd(5);
  for (WeightType type : {WeightType::kBf16, WeightType::kF32}) {
    const WeightMatrix w = rnd.Matrix(40, 300, 0.1f, type);  // 300 columns: two blocks, one partial
    for (int64_t tokens : {1, 3}) {  // widened in registers, and once per row
      const int64_t x_stride = 45, y_stride = 310;
      std::vector<float> x = rnd.Normal(tokens * x_stride, 0.0f, 1.0f);
      std::vector<float> y(tokens * y_stride, 7.0f);
      MatMulTransposed(w, x.data(), x_stride, tokens, y.data(), y_stride);
      std::vector<double> expected(y.begin(), y.end());
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < w.cols; ++c) {
          double sum = 0;
          for (int64_t r = 0; r < w.rows; ++r)
            sum += static_cast<double>(w.At(r, c)) * x[t * x_stride + r];
          expected[t * y_stride + c] = sum;
        }
      }
      EXPECT_TRUE(AllClose(y, expected, 1e-5)) << tokens << " tokens";
    }
  }
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
