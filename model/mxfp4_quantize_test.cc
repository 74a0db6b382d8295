#include "model/mxfp4_quantize.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4.h"

namespace k3 {
namespace {

float Decoded(const Mxfp4Bytes& q, int64_t cols, int64_t r, int64_t c) {
  const WeightMatrix w{q.codes.data(), WeightType::kMxfp4, r + 1, cols,
                       reinterpret_cast<const uint8_t*>(q.scales.data())};
  return w.At(r, c);
}

// Values already on the MXFP4 grid come back unchanged (including signs and zero).
TEST(QuantizeMxfp4Test, RepresentableValuesRoundTripExactly) {
  const int64_t rows = 3, cols = 64;
  std::vector<float> values(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t group = i / kMxfp4Group;
    // Each group holds 6 * scale somewhere, so its chosen scale is that scale.
    const float scale = std::ldexp(1.0f, static_cast<int>(group) - 4);
    values[i] = (i % kMxfp4Group == 5 ? 6.0f : kE2m1Values[(i * 7) % 16]) * scale;
  }
  const Mxfp4Bytes q = QuantizeMxfp4(values.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(Decoded(q, cols, r, c), values[r * cols + c]) << r << "," << c;
    }
  }
}

// Bytes worked out by hand from spec §10 (E2M1 codes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for 0-7, bit 3 the
// sign; element 2i in the low nibble; E8M0 scale 2^(s - 127)) and the header's rounding rules
// (smallest scale holding the group's largest magnitude, nearest value, ties to the even code),
// without the decoder.
TEST(QuantizeMxfp4Test, BytesMatchTheSpecsEncodingWorkedByHand) {
  std::vector<float> row(4 * kMxfp4Group, 0.0f);
  // Group 0, max 6: scale 2^0 (byte 127).
  const float group0[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6,         // codes 0-7
                            -0.5f, -1, -1.5f, -2,                 // codes 9-12
                            2.4f, 2.5f,                           // 2 (code 4); tie 2|3: code 4
                            5.0f, 0.25f};                         // tie 4|6: 6; tie 0|0.5: 0
  std::copy(group0, group0 + 16, row.begin());
  // Group 1, max 7 > 6: scale 2^1 (byte 128). 7/2 = 3.5 ties 3|4: code 6; -0.75/2 = -0.375 is
  // nearest -0.5: code 9; 1/2 = 0.5: code 1.
  row[32] = 7.0f;
  row[33] = -0.75f;
  row[34] = 1.0f;
  // Group 2 all zero: byte 127. Group 3, max 0.1: 6 * 2^-6 = 0.09375 is short, 6 * 2^-5 holds
  // it (byte 122); 0.1 / 2^-5 = 3.2: code 5.
  row[96] = 0.1f;
  const Mxfp4Bytes q = QuantizeMxfp4(row.data(), 1, 4 * kMxfp4Group);
  EXPECT_EQ(q.scales, std::string({'\x7f', '\x80', '\x7f', '\x7a'}));
  std::string codes(2 * kMxfp4Group, '\0');
  const uint8_t hand[] = {0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0x44, 0x06};
  for (int i = 0; i < 8; ++i) codes[i] = static_cast<char>(hand[i]);
  codes[16] = static_cast<char>(0x96);
  codes[17] = static_cast<char>(0x01);
  codes[48] = static_cast<char>(0x05);
  ASSERT_EQ(q.codes.size(), codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_EQ(static_cast<uint8_t>(q.codes[i]), static_cast<uint8_t>(codes[i])) << "byte " << i;
  }
}

// Spec §10's golden: the first 16 values of row 0 of layers.1...experts.0.w1 in the release. They
// are one group's E2M1 codes at scale 2^-6 (byte 121, the smallest that holds 0.0625), including a
// negative zero (code 8); quantizing them must find that scale and give them back bit for bit.
TEST(QuantizeMxfp4Test, SpecGoldenRowIsOneGroupAtScaleTwoToTheMinusSix) {
  const float golden[16] = {0.0625f,     0.0078125f,  -0.0078125f, -0.0234375f,
                            -0.0625f,    -0.03125f,   0.0234375f,  0.015625f,
                            0.046875f,   -0.0f,       -0.0234375f, -0.015625f,
                            -0.0234375f, -0.0078125f, 0.015625f,   -0.015625f};
  std::vector<float> row(kMxfp4Group, 0.0f);
  std::copy(golden, golden + 16, row.begin());
  const Mxfp4Bytes q = QuantizeMxfp4(row.data(), 1, kMxfp4Group);
  EXPECT_EQ(static_cast<uint8_t>(q.scales[0]), 121);
  for (int i = 0; i < 16; ++i) {
    const float got = Decoded(q, kMxfp4Group, 0, i);
    EXPECT_EQ(got, golden[i]) << i;
    EXPECT_EQ(std::signbit(got), std::signbit(golden[i])) << i;
  }
  // Byte 4: element 8 (3 * 2^-6, code 5) in the low nibble, element 9 (-0, code 8) in the high.
  EXPECT_EQ(static_cast<uint8_t>(q.codes[4]), 0x85);
}

// Random values: every decoded value is the nearest grid point, so the error is at most half a
// grid step at that magnitude (a quarter of the scale below 2 * scale, up to one scale at the top),
// and the group maximum never clips.
TEST(QuantizeMxfp4Test, RandomValuesRoundToNearestWithoutClipping) {
  const int64_t rows = 8, cols = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values(rows * cols);
  for (float& v : values) v = normal(rng);
  const Mxfp4Bytes q = QuantizeMxfp4(values.data(), rows, cols);
  for (int64_t g = 0; g < rows * cols / kMxfp4Group; ++g) {
    const float scale = E8m0Scale(static_cast<uint8_t>(q.scales[g]));
    float amax = 0;
    for (int64_t i = 0; i < kMxfp4Group; ++i) amax = std::max(amax, std::abs(values[g * 32 + i]));
    EXPECT_LE(amax, 6.0f * scale);
    EXPECT_GT(amax, 3.0f * scale);  // the smallest such scale
    for (int64_t i = 0; i < kMxfp4Group; ++i) {
      const int64_t index = g * kMxfp4Group + i;
      const float got = Decoded(q, cols, index / cols, index % cols);
      const float magnitude = std::abs(values[index]) / scale;
      const float step = magnitude < 2.0f ? 0.5f : magnitude < 4.0f ? 1.0f : 2.0f;
      EXPECT_LE(std::abs(got - values[index]), 0.5f * step * scale) << index;
    }
  }
}

}  // namespace
}  // namespace k3
