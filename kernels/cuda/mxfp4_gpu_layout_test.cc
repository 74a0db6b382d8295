#include "kernels/cuda/mxfp4_gpu_layout.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/gated_mlp.h"
#include "kernels/mxfp4.h"

namespace k3 {
namespace {

struct RandomMatrix {
  std::vector<uint8_t> codes, scales;
  Mxfp4HostMatrix view;
};

// Every code and every scale byte up to kMxfp4MaxScale, at random.
RandomMatrix Random(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  RandomMatrix m;
  m.codes.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 32);
  for (uint8_t& c : m.codes) c = rng() & 0xff;
  for (uint8_t& s : m.scales) s = rng() % (kMxfp4MaxScale + 1);
  m.view = Mxfp4HostMatrix{m.codes.data(), m.scales.data(), rows, cols};
  return m;
}

// The A fragment of mma.m16n8k16 (.bf16), as the PTX ISA's table gives it: register p of lane
// (g = lane / 4, t = lane % 4) holds (row, input) and (row, input + 1).
struct Place {
  int row, input;
};
Place FragmentPlace(int lane, int p) {
  const int g = lane / 4, t = lane % 4;
  switch (p) {
    case 0: return {g, 2 * t};
    case 1: return {g + 8, 2 * t};
    case 2: return {g, 2 * t + 8};
    default: return {g + 8, 2 * t + 8};
  }
}

// Reads the repacked matrix the way the kernel does (a lane's 16 bytes, its words, the pair bits,
// times 2^126 and its rows' scales) and checks every element against kernels/mxfp4.h.
void ExpectKernelReadsTheMatrix(const RandomMatrix& m) {
  const int64_t rows = m.view.rows, cols = m.view.cols;
  std::vector<uint8_t> codes(GpuMxfp4CodeBytes(rows, cols)), scales(GpuMxfp4ScaleBytes(rows, cols));
  RepackMxfp4ForGpu(m.view, codes.data(), scales.data());
  const float two_to_126 = Bf16ToFloat(kBf16TwoTo126);
  ASSERT_EQ(two_to_126, std::ldexp(1.0f, 126));
  std::vector<int> seen(rows * cols, 0);
  const int64_t input_tiles = cols / 64;
  for (int64_t mt = 0; mt < rows / 16; ++mt) {
    for (int64_t kc = 0; kc < input_tiles; ++kc) {
      const int64_t tile = mt * input_tiles + kc;
      for (int lane = 0; lane < 32; ++lane) {
        uint8_t scale_bytes[4];
        std::memcpy(scale_bytes, scales.data() + tile * 32 + (lane / 4) * 4, 4);
        for (int j = 0; j < 4; ++j) {
          uint32_t word;
          std::memcpy(&word, codes.data() + tile * 512 + lane * 16 + j * 4, 4);
          for (int p = 0; p < 4; ++p) {
            const uint32_t bits = Mxfp4PairBits(word, p);
            const Place place = FragmentPlace(lane, p);
            const int64_t row = mt * 16 + place.row;
            for (int half = 0; half < 2; ++half) {
              const int64_t col = kc * 64 + j * 16 + place.input + half;
              const int group_in_tile = (j * 16 + place.input) / 32;
              const uint8_t scale = scale_bytes[(place.row >= 8 ? 2 : 0) + group_in_tile];
              const float code = Bf16ToFloat((bits >> (16 * half)) & 0xffff) * two_to_126;
              const float got = code * E8m0Scale(scale);
              const float want = Mxfp4Element(m.view.codes + row * (cols / 2),
                                              m.view.scales + row * (cols / 32), col);
              ASSERT_EQ(got, want) << "row " << row << " col " << col;
              ASSERT_EQ(std::signbit(got), std::signbit(want)) << "row " << row << " col " << col;
              ++seen[row * cols + col];
            }
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(seen[i], 1) << "element " << i;
}

TEST(Mxfp4GpuLayoutTest, KernelReadsEveryElementOnceAndExactly) {
  ExpectKernelReadsTheMatrix(Random(16, 64, 1));
  ExpectKernelReadsTheMatrix(Random(64, 128, 2));   // k3-tiny's w1/w3
  ExpectKernelReadsTheMatrix(Random(128, 64, 3));   // k3-tiny's w2
  ExpectKernelReadsTheMatrix(Random(48, 3584, 4));  // a slice of K3's w1/w3 rows
}

// The 32 code bits of a word's eight codes each have their own word bit, and each register's
// rotation and mask take exactly its own codes' bits to bf16 bits 15, 8, 7, 6 of their half.
TEST(Mxfp4GpuLayoutTest, CodeBitsArePermutedAndEachRegisterTakesOnlyItsOwn) {
  uint32_t seen = 0;
  for (int p = 0; p < 4; ++p) {
    for (int half = 0; half < 2; ++half) {
      for (int b = 0; b < 4; ++b) {
        const int position = Mxfp4CodeBitPosition(p, half, b);
        ASSERT_GE(position, 0);
        ASSERT_LT(position, 32);
        EXPECT_EQ((seen >> position) & 1u, 0u) << "register " << p << " half " << half;
        seen |= 1u << position;
        const uint32_t one_bit = 1u << position;
        const int bf16_bit = 16 * half + (b == 3 ? 15 : 6 + b);
        for (int q = 0; q < 4; ++q) {
          EXPECT_EQ(Mxfp4PairBits(one_bit, q), q == p ? 1u << bf16_bit : 0u)
              << "register " << p << " half " << half << " bit " << b << " read as " << q;
        }
      }
    }
  }
  EXPECT_EQ(seen, 0xffffffffu);
}

TEST(Mxfp4GpuLayoutTest, ShapesTheKernelsTake) {
  EXPECT_TRUE(GpuMxfp4ShapeOk(3072, 3584));
  EXPECT_TRUE(GpuMxfp4ShapeOk(3584, 3072));
  EXPECT_TRUE(GpuMxfp4ShapeOk(64, 128));
  EXPECT_FALSE(GpuMxfp4ShapeOk(24, 128));
  EXPECT_FALSE(GpuMxfp4ShapeOk(64, 96));
  EXPECT_FALSE(GpuMxfp4ShapeOk(0, 64));
}

// The kernels' epilogue formula against the CPU's, and against the spec's check values (§3.2).
TEST(Mxfp4GpuLayoutTest, GluMatchesTheCpuAndTheSpec) {
  const GluParams cpu{true, 4.0f, 25.0f};
  const GpuGluParams gpu{1, 4.0f, 25.0f};
  EXPECT_NEAR(GpuGluCombine(gpu, -2.f, 3.f), -0.658f, 5e-4f);
  EXPECT_NEAR(GpuGluCombine(gpu, 2.f, 3.f), 4.861f, 5e-4f);
  EXPECT_NEAR(GpuGluCombine(gpu, 8.f, 3.f), 11.509f, 5e-4f);
  EXPECT_NEAR(GpuGluCombine(gpu, 40.f, 40.f), 92.17f, 5e-3f);
  const GluParams swiglu{false, 1.0f, 0.f};
  const GpuGluParams gpu_swiglu{0, 1.0f, 0.f};
  for (float a = -30.f; a <= 30.f; a += 0.37f) {
    for (float b = -40.f; b <= 40.f; b += 3.1f) {
      EXPECT_NEAR(GpuGluCombine(gpu, a, b), GluCombine(cpu, a, b),
                  1e-6f * (1.f + std::abs(GluCombine(cpu, a, b))));
      EXPECT_NEAR(GpuGluCombine(gpu_swiglu, a, b), GluCombine(swiglu, a, b),
                  1e-6f * (1.f + std::abs(GluCombine(swiglu, a, b))));
    }
  }
}

}  // namespace
}  // namespace k3
