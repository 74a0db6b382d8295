// glu.h's device code (glu_kernel.inc) run on the CPU under simt_emulation.h against its CPU twins,
// kernels/gated_mlp.h's GluCombine, kernels/bf16.h's FloatToBf16 and MulSigmoid's formula, on
// every machine. On the CPU
// the kernel's tanhf and expf are the ones GluCombine calls, in the same order, so the bf16 results
// must be equal bit for bit (glu_test.cc allows the GPU's math functions one bf16 step).
#include "kernels/cuda/simt_emulation.h"
// After the emulation, which defines what the device code uses of CUDA.
#include <cmath>
#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/cuda/glu.h"

#include "kernels/cuda/glu_kernel.inc"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gated_mlp.h"

namespace k3 {
namespace {

TEST(GluEmulationTest, MatchesGluCombineAndRounding) {
  constexpr int kRows = 3, kWidth = 300, kStride = 310;  // a partial last block, padded rows
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 6.0f);  // reaches the caps (β 4, λ 25)
  std::vector<float> gate(kRows * kStride), up(kRows * kStride);
  for (float& x : gate) x = normal(rng);
  for (float& x : up) x = 5.0f * normal(rng);
  for (const GluParams& params :
       {GluParams{true, 4.0f, 25.0f}, GluParams{true, 4.0f, 0.0f}, GluParams{false, 0.0f, 0.0f}}) {
    SCOPED_TRACE(testing::Message() << "situ " << params.situ << " λ " << params.linear_beta);
    std::vector<uint16_t> hidden(kRows * kStride, 0xffff), rounded(kRows * kStride, 0xffff);
    // Two blocks along y for three rows: rows past the grid loop, as they do past 65,535.
    simt::RunGrid({2, 2, 1}, {kGluThreads, 1, 1}, [&] {
      GluCombineKernel(params, gate.data(), up.data(), kStride, kRows, kWidth, hidden.data(),
                       kStride);
    });
    simt::RunGrid({2, 2, 1}, {kGluThreads, 1, 1}, [&] {
      RoundToBf16Kernel(gate.data(), kStride, kRows, kWidth, rounded.data(), kStride);
    });
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kStride; ++c) {
        const int i = r * kStride + c;
        if (c >= kWidth) {  // past the width: untouched
          ASSERT_EQ(hidden[i], 0xffff);
          ASSERT_EQ(rounded[i], 0xffff);
          continue;
        }
        ASSERT_EQ(hidden[i], FloatToBf16(GluCombine(params, gate[i], up[i]))) << r << ", " << c;
        ASSERT_EQ(rounded[i], FloatToBf16(gate[i])) << r << ", " << c;
      }
    }
  }
}

// MulSigmoid's formula, x / (1 + e^-gate), with the same expf: bit for bit.
TEST(GluEmulationTest, MulSigmoidMatchesItsFormula) {
  constexpr int kCount = 600;  // three blocks, the last partial
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> gate(kCount + 1), x(kCount + 1);
  for (float& v : gate) v = normal(rng);
  for (float& v : x) v = normal(rng);
  std::vector<float> got = x;
  simt::RunGrid({3, 1, 1}, {kGluThreads, 1, 1},
                [&] { MulSigmoidKernel(gate.data(), got.data(), kCount); });
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(got[i], x[i] / (1.0f + std::exp(-gate[i]))) << i;
  EXPECT_EQ(got[kCount], x[kCount]);  // past n: untouched
}

}  // namespace
}  // namespace k3
