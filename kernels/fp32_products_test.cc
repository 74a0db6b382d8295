#include "kernels/fp32_products.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

std::vector<float> Normal(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// max_i |actual_i − expected_i| <= rtol · max_i |expected_i|.
::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<double>& expected, double rtol) {
  double scale = 0.0, worst = 0.0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff = std::fabs(actual[i] - expected[i]);
    if (!(diff <= worst)) worst = std::isnan(diff) ? INFINITY : diff;
  }
  if (worst <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << worst << " > " << rtol << " · " << scale;
}

TEST(Fp32ProductsTest, DotAndAxpyOnOddLengths) {
  std::mt19937 rng(2);
  for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 200}) {
    std::vector<float> a = Normal(rng, n), b = Normal(rng, n);
    double dot = 0;
    std::vector<double> axpy(n);
    for (int64_t i = 0; i < n; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      axpy[i] = b[i] + 0.5 * a[i];
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), dot, 1e-5 * n) << n;
    std::vector<float> y = b;
    Axpy(0.5f, a.data(), y.data(), n);
    EXPECT_TRUE(AllClose(y, axpy, 1e-6)) << n;
  }
}

// Every (row of a, row of b) pair against an fp64 dot product, for row counts around the
// four-row groups, vector tails and strides wider than the rows.
TEST(Fp32ProductsTest, DotRowsMatchesEveryPairwiseDot) {
  std::mt19937 rng(3);
  for (int64_t m : {1, 3, 4, 5, 8, 9}) {
    for (int64_t n : {1, 15, 16, 80, 83}) {
      const int64_t k = 7, a_ld = n + 3, b_ld = n + 5, out_ld = k + 2;
      const std::vector<float> a = Normal(rng, m * a_ld);
      const std::vector<float> b = Normal(rng, k * b_ld);
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

TEST(Fp32ProductsTest, GemmMatchesNaiveProductWithTailsStridesAndAccumulation) {
  std::mt19937 rng(4);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {4, 32, 8}, {7, 45, 13}, {16, 128, 128}, {9, 70, 0}}) {
    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
    const std::vector<float> a = Normal(rng, m * lda);
    const std::vector<float> b = Normal(rng, std::max<int64_t>(k, 1) * ldb);
    const std::vector<float> c0 = Normal(rng, m * ldc);
    for (bool accumulate : {false, true}) {
      std::vector<float> c = c0;
      Gemm(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
      std::vector<double> expected(c0.begin(), c0.end());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = accumulate ? c0[i * ldc + j] : 0.0;
          for (int64_t kk = 0; kk < k; ++kk) {
            sum += static_cast<double>(a[i * lda + kk]) * b[kk * ldb + j];
          }
          expected[i * ldc + j] = sum;
        }
      }
      EXPECT_TRUE(AllClose(c, expected, 1e-5)) << m << "x" << n << "x" << k;
    }
  }
}

}  // namespace
}  // namespace k3
