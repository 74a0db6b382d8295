#include "kernels/matmul_transposed.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"

namespace k3 {
namespace {

// y = Wᵀ x against a double-precision loop, for both weight types it takes: 300 columns are two
// blocks, one partial; 1 token widens in registers, 3 share one widened copy per row. The gaps of
// y past W.cols keep their values.
TEST(MatMulTransposedTest, MatchesNaiveForBothWeightTypes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 40, cols = 300;
  std::vector<uint16_t> bf16(rows * cols);
  std::vector<float> f32(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    bf16[i] = FloatToBf16(0.1f * normal(rng));
    f32[i] = Bf16ToFloat(bf16[i]);
  }
  for (const WeightMatrix& w : {WeightMatrix{bf16.data(), WeightType::kBf16, rows, cols},
                                WeightMatrix{f32.data(), WeightType::kF32, rows, cols}}) {
    for (int64_t tokens : {1, 3}) {
      SCOPED_TRACE(std::to_string(tokens) + " tokens, type " +
                   std::to_string(static_cast<int>(w.type)));
      const int64_t x_stride = 45, y_stride = 310;
      std::vector<float> x(tokens * x_stride);
      for (float& v : x) v = normal(rng);
      std::vector<float> y(tokens * y_stride, 7.0f);
      MatMulTransposed(w, x.data(), x_stride, tokens, y.data(), y_stride);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < y_stride; ++c) {
          const float got = y[t * y_stride + c];
          if (c >= cols) {
            EXPECT_EQ(got, 7.0f) << "wrote past the column end at " << c;
            continue;
          }
          double expected = 0, magnitude = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const double product = static_cast<double>(w.At(r, c)) * x[t * x_stride + r];
            expected += product;
            magnitude += std::abs(product);
          }
          EXPECT_NEAR(got, expected, 1e-5 * magnitude) << "token " << t << " column " << c;
        }
      }
    }
  }
}

TEST(MatMulTransposedDeathTest, RejectsMxfp4Weights) {
  const uint8_t codes[16] = {}, scales[1] = {127};
  const WeightMatrix w{codes, WeightType::kMxfp4, 1, 32, scales};
  float x = 1.0f, y[32];
  EXPECT_DEATH(MatMulTransposed(w, &x, 1, 1, y, 32), "MXFP4");
}

}  // namespace
}  // namespace k3
