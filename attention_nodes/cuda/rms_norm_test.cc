// RMSNorm on a GPU (rms_norm.cu) against kernels/rms_norm.h's RmsNormRows on random rows, at
// k3-tiny's width (256), K3's (7168) and an odd width (100), with row strides above the width and
// in place. Tolerance: the CPU sums the squares in double, the GPU in fp32 over 256 threads then
// 8 warps (relative error ~1e-7 x log of the terms); the outputs are products of that root with
// the value and gamma, so they agree to a few fp32 ulps: bound 1e-5 of max |cpu|. Without a GPU
// the GPU cases report themselves skipped ("no GPU").
#include "attention_nodes/cuda/rms_norm.h"

#include <vector>

#include "kernels/cuda/gpu_test_util.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "kernels/rms_norm.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;

void ExpectMatchesCpu(int rows, int width, int stride, bool in_place, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << rows << " x " << width << " stride " << stride);
  RandomWeights rnd(seed);
  const std::vector<float> x = rnd.Normal(rows * stride, 0.5f, 2.0f);
  const std::vector<float> gamma = rnd.Normal(width, 1.0f, 0.1f);
  constexpr float kEps = 1e-5f;
  std::vector<float> expected(x);
  RmsNormRows(x.data(), stride, rows, width, gamma.data(), kEps, expected.data(), stride);

  DeviceArray<float> x_dev(x), gamma_dev(gamma), y_dev(x);
  float* y = in_place ? x_dev.get() : y_dev.get();
  ASSERT_EQ(LaunchRmsNorm(x_dev.get(), stride, rows, width, gamma_dev.get(), kEps, y, stride,
                          nullptr),
            0);
  gpu_test::ExpectDeviceOk();
  // Columns past the width keep x's values on both sides.
  EXPECT_TRUE(AllClose(in_place ? x_dev.Download() : y_dev.Download(), expected, 1e-5));
}

TEST(RmsNormGpuTest, MatchesCpu) {
  REQUIRE_GPU();
  ExpectMatchesCpu(5, 256, 256, false, 1);
  ExpectMatchesCpu(3, 7168, 7200, false, 2);
  ExpectMatchesCpu(7, 100, 128, true, 3);
  ExpectMatchesCpu(2, 7168, 7168, true, 4);
}

TEST(RmsNormGpuTest, RefusesBadShapes) {
  EXPECT_NE(LaunchRmsNorm(nullptr, 10, 1, 20, nullptr, 1e-5f, nullptr, 20, nullptr), 0);
  EXPECT_NE(LaunchRmsNorm(nullptr, 20, 0, 20, nullptr, 1e-5f, nullptr, 20, nullptr), 0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
