// GpuGatedMlp (gpu_gated_mlp.cc: cuBLAS and glu.h's kernels) against its CPU twin, GatedMlp
// (kernels/gated_mlp.h), on random BF16 weights: k3-tiny's shared expert (256 -> 512 -> 256),
// K3's (7168 -> 3072 -> 7168, one of its two shared experts) at 1, 8 and 64 rows, SwiGLU, and
// accumulation into y. Tolerance: the GPU rounds the rows and the hidden vector to bf16 (2^-9
// relative per element; the CPU keeps fp32), which moves an output row by ~1e-3 of its norm:
// relative L2 per row <= 1e-2. glu_test.cc checks the elementwise kernels on their own. Without
// a GPU the GPU cases report themselves skipped ("no GPU").
#include "kernels/cuda/gpu_gated_mlp.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/gated_mlp.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;

struct Bf16Matrix {
  std::vector<uint16_t> bits;
  WeightMatrix view;
};

Bf16Matrix RandomMatrix(int64_t rows, int64_t cols, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  Bf16Matrix m;
  m.bits.resize(rows * cols);
  for (uint16_t& b : m.bits) b = FloatToBf16(normal(rng));
  m.view = WeightMatrix{m.bits.data(), WeightType::kBf16, rows, cols};
  return m;
}

void ExpectMatchesCpu(int64_t d, int64_t f, int64_t tokens, const GluParams& params,
                      bool accumulate, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "d " << d << " f " << f << " tokens " << tokens);
  std::mt19937 rng(seed);
  const Bf16Matrix gate = RandomMatrix(f, d, 1.0f / std::sqrt(d), rng);
  const Bf16Matrix up = RandomMatrix(f, d, 1.0f / std::sqrt(d), rng);
  const Bf16Matrix down = RandomMatrix(d, f, 1.0f / std::sqrt(f), rng);
  const GatedMlpMatrices w{gate.view, up.view, down.view};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(tokens * d), y0(tokens * d);
  for (float& v : x) v = normal(rng);
  for (float& v : y0) v = normal(rng);
  std::vector<float> expected(y0), scratch;
  GatedMlp(w, params, x.data(), tokens, expected.data(), accumulate, &scratch);

  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  auto mlp = GpuGatedMlp::Create(w, params, products->get());
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  DeviceArray<float> x_dev(x), y_dev(y0);
  ASSERT_TRUE((*mlp)->Run(x_dev.get(), tokens, y_dev.get(), accumulate).ok());
  gpu_test::ExpectDeviceOk();
  const std::vector<float> got = y_dev.Download();
  for (int64_t t = 0; t < tokens; ++t) {
    double error = 0, norm = 0;
    for (int64_t i = t * d; i < (t + 1) * d; ++i) {
      error += (got[i] - expected[i]) * (got[i] - expected[i]);
      norm += expected[i] * expected[i];
    }
    EXPECT_LE(std::sqrt(error / norm), 1e-2) << "row " << t;
  }
}

TEST(GpuGatedMlpTest, MatchesGatedMlp) {
  REQUIRE_GPU();
  const GluParams situ{true, 4.0f, 25.0f}, swiglu{false, 0.0f, 0.0f};
  ExpectMatchesCpu(256, 512, 5, situ, false, 1);
  ExpectMatchesCpu(256, 512, 3, swiglu, true, 2);
  for (int64_t tokens : {1, 8, 64}) ExpectMatchesCpu(7168, 3072, tokens, situ, tokens == 8, 3);
}

TEST(GpuGatedMlpTest, RefusesOtherWeightsAndShapes) {
  std::mt19937 rng(4);
  const Bf16Matrix a = RandomMatrix(8, 16, 1.0f, rng), b = RandomMatrix(8, 8, 1.0f, rng);
  // Refused before the products are touched: none needed.
  EXPECT_FALSE(GpuGatedMlp::Create({a.view, b.view, b.view}, GluParams{}, nullptr).ok());
  WeightMatrix f32 = a.view;
  f32.type = WeightType::kF32;
  EXPECT_FALSE(GpuGatedMlp::Create({f32, a.view, b.view}, GluParams{}, nullptr).ok());
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
