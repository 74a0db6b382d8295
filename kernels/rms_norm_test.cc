#include "kernels/rms_norm.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// The plain fp64 loop RMSNorm is defined by.
std::vector<double> ReferenceRow(const float* x, const float* gamma, int64_t width, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(sum / width + eps);
  std::vector<double> y(width);
  for (int64_t i = 0; i < width; ++i) y[i] = static_cast<double>(gamma[i]) * x[i] * inv;
  return y;
}

std::vector<float> Normal(std::mt19937* rng, size_t n, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// Widths around the 16-lane vector and a model-sized row; strided, dense and in place.
TEST(RmsNormTest, MatchesFp64LoopStridedAndInPlace) {
  std::mt19937 rng(7);
  for (int64_t width : {1, 15, 16, 17, 37, 1024, 7168}) {
    const int64_t rows = 3, stride = width + 5;
    const float eps = 1e-5f;
    std::vector<float> x = Normal(&rng, rows * stride, 0.0f, 2.0f);
    const std::vector<float> gamma = Normal(&rng, width, 1.0f, 0.1f);
    std::vector<float> dense(rows * width);
    RmsNormRows(x.data(), stride, rows, width, gamma.data(), eps, dense.data(), width);
    std::vector<float> in_place = x;
    RmsNormRows(in_place.data(), stride, rows, width, gamma.data(), eps, in_place.data(), stride);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<double> expected =
          ReferenceRow(x.data() + r * stride, gamma.data(), width, eps);
      for (int64_t i = 0; i < width; ++i) {
        // Three fp32 roundings (the inverse root and two products): a few ulp.
        const double tolerance = 4e-7 * std::abs(expected[i]) + 1e-30;
        EXPECT_NEAR(dense[r * width + i], expected[i], tolerance) << width << " " << r << " " << i;
        EXPECT_EQ(in_place[r * stride + i], dense[r * width + i]) << width << " " << r << " " << i;
      }
      // The stride padding is not written.
      for (int64_t i = width; i < stride; ++i) {
        EXPECT_EQ(in_place[r * stride + i], x[r * stride + i]);
      }
    }
  }
}

// Values whose squares span many orders of magnitude: an fp32 running sum would drop the small
// ones; the double accumulation keeps them.
TEST(RmsNormTest, SumOfSquaresKeepsSmallTerms) {
  std::vector<float> x(4097, 1e-4f);
  x[0] = 1e3f;
  double expected = 0;
  for (float v : x) expected += static_cast<double>(v) * v;
  EXPECT_NEAR(SumOfSquares(x.data(), static_cast<int64_t>(x.size())), expected, 1e-12 * expected);
  EXPECT_EQ(SumOfSquares(x.data(), 0), 0.0);
}

}  // namespace
}  // namespace k3
