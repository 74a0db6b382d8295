// glu.h's kernels on a GPU against their CPU twins: LaunchRoundToBf16 against kernels/bf16.h's
// FloatToBf16 (bit for bit: both round to nearest even); LaunchGluCombine against
// kernels/gated_mlp.h's GluCombine rounded the same way, at K3's shared-expert width (3072) and an
// odd one, SiTU-GLU with and without the up branch's cap, and SwiGLU; LaunchMulSigmoid against
// MulSigmoid's formula. The GPU's tanhf and expf may differ from the CPU's in the last fp32 bit,
// which can move a bf16 rounding by one step: the hidden values agree within one bf16 step (2^-7
// relative). Without a GPU the GPU cases report themselves skipped ("no GPU").
#include "kernels/cuda/glu.h"

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

void ExpectMatchesCpu(const GluParams& params, int rows, int width, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << rows << " x " << width << " situ " << params.situ);
  const int stride = width + 7;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  std::vector<float> gate(rows * stride), up(rows * stride);
  for (float& v : gate) v = normal(rng);
  for (float& v : up) v = 5.0f * normal(rng);
  DeviceArray<float> gate_dev(gate), up_dev(up);
  DeviceArray<uint16_t> hidden_dev(static_cast<size_t>(rows) * width),
      rounded_dev(static_cast<size_t>(rows) * width);
  ASSERT_EQ(LaunchGluCombine(params, gate_dev.get(), up_dev.get(), stride, rows, width,
                             hidden_dev.get(), width, nullptr),
            0);
  ASSERT_EQ(
      LaunchRoundToBf16(gate_dev.get(), stride, rows, width, rounded_dev.get(), width, nullptr), 0);
  gpu_test::ExpectDeviceOk();
  const std::vector<uint16_t> hidden = hidden_dev.Download(), rounded = rounded_dev.Download();
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      const int i = r * stride + c, o = r * width + c;
      ASSERT_EQ(rounded[o], FloatToBf16(gate[i])) << r << ", " << c;
      const float expected = Bf16ToFloat(FloatToBf16(GluCombine(params, gate[i], up[i])));
      ASSERT_NEAR(Bf16ToFloat(hidden[o]), expected, 0x1p-7f * std::fabs(expected) + 1e-30f)
          << r << ", " << c;
    }
  }
}

TEST(GluGpuTest, MatchesCpu) {
  REQUIRE_GPU();
  ExpectMatchesCpu(GluParams{true, 4.0f, 25.0f}, 9, 3072, 1);
  ExpectMatchesCpu(GluParams{true, 4.0f, 0.0f}, 4, 1000, 2);
  ExpectMatchesCpu(GluParams{false, 0.0f, 0.0f}, 3, 513, 3);
}

// Against MulSigmoid's formula on the CPU: the GPU's expf may differ in the last bit (2e-7).
TEST(GluGpuTest, MulSigmoidMatchesCpu) {
  REQUIRE_GPU();
  constexpr int64_t kCount = 96 * 128 * 3 + 17;  // K3's MLA gate, three tokens, and a tail
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> gate(kCount), x(kCount);
  for (float& v : gate) v = normal(rng);
  for (float& v : x) v = normal(rng);
  DeviceArray<float> gate_dev(gate), x_dev(x);
  ASSERT_EQ(LaunchMulSigmoid(gate_dev.get(), x_dev.get(), kCount, nullptr), 0);
  gpu_test::ExpectDeviceOk();
  const std::vector<float> got = x_dev.Download();
  for (int64_t i = 0; i < kCount; ++i) {
    const float want = x[i] / (1.0f + std::exp(-gate[i]));
    ASSERT_NEAR(got[i], want, 2e-7f * std::fabs(want) + 1e-30f) << i;
  }
}

TEST(GluGpuTest, RefusesBadShapes) {
  EXPECT_NE(LaunchMulSigmoid(nullptr, nullptr, 0, nullptr), 0);
  EXPECT_NE(LaunchRoundToBf16(nullptr, 10, 1, 20, nullptr, 20, nullptr), 0);
  EXPECT_NE(LaunchGluCombine(GluParams{}, nullptr, nullptr, 20, 0, 20, nullptr, 20, nullptr), 0);
  EXPECT_NE(LaunchGluCombine(GluParams{}, nullptr, nullptr, 20, 70000, 20, nullptr, 20, nullptr),
            0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
