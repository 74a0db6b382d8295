#include "kernels/mxfp4.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// The E2M1 table from its bit fields (sign, 2 exponent bits with bias 1, 1 mantissa bit;
// exponent 0 is subnormal: m * 0.5).
TEST(Mxfp4Test, TableMatchesE2m1BitFields) {
  for (int code = 0; code < 16; ++code) {
    const int sign = code >> 3, exponent = (code >> 1) & 3, mantissa = code & 1;
    const double magnitude =
        exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1);
    EXPECT_EQ(kE2m1Values[code], sign ? -magnitude : magnitude) << code;
    EXPECT_EQ(std::signbit(kE2m1Values[code]), sign == 1) << code;
  }
}

TEST(Mxfp4Test, ScaleIsPowerOfTwoWithZeroNotZeroAnd255NaN) {
  EXPECT_EQ(E8m0Scale(127), 1.0f);
  EXPECT_EQ(E8m0Scale(128), 2.0f);
  EXPECT_EQ(E8m0Scale(120), 1.0f / 128);
  EXPECT_EQ(E8m0Scale(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(static_cast<double>(E8m0Scale(0)), std::ldexp(1.0, -127));  // a subnormal, not 0
  EXPECT_TRUE(std::isnan(E8m0Scale(kMxfp4NanScale)));
  // The largest accepted scale keeps the largest code finite; the next one does not.
  EXPECT_TRUE(std::isfinite(6.0f * E8m0Scale(kMxfp4MaxScale)));
  EXPECT_FALSE(std::isfinite(6.0f * E8m0Scale(kMxfp4MaxScale + 1)));
}

// A hand-built 2 x 64 tensor: codes and scales chosen so that each decoded value is known.
TEST(Mxfp4Test, ElementReadsLowNibbleFirstAndItsGroupScale) {
  std::vector<uint8_t> codes(2 * 32, 0), scales = {127, 125, 0, 130};
  codes[0] = 0x92;   // element 0: code 2 (1.0), element 1: code 9 (-0.5)
  codes[16] = 0x7f;  // elements 32, 33 (group 1, scale 2^-2): -6, 6
  codes[32] = 0x03;  // row 1 element 0 (scale 2^-127): 1.5 * 2^-127; element 1: 0
  codes[63] = 0xd0;  // row 1 element 63 (scale 2^3): element 62 = 0, element 63 = code 13 (-3)
  EXPECT_EQ(Mxfp4Element(codes.data(), scales.data(), 0), 1.0f);
  EXPECT_EQ(Mxfp4Element(codes.data(), scales.data(), 1), -0.5f);
  EXPECT_EQ(Mxfp4Element(codes.data(), scales.data(), 2), 0.0f);
  EXPECT_EQ(Mxfp4Element(codes.data(), scales.data(), 32), -1.5f);
  EXPECT_EQ(Mxfp4Element(codes.data(), scales.data(), 33), 1.5f);
  const uint8_t* row1 = codes.data() + 32;
  const uint8_t* row1_scales = scales.data() + 2;
  EXPECT_EQ(static_cast<double>(Mxfp4Element(row1, row1_scales, 0)), 1.5 * std::ldexp(1.0, -127));
  EXPECT_EQ(Mxfp4Element(row1, row1_scales, 1), 0.0f);
  EXPECT_EQ(Mxfp4Element(row1, row1_scales, 62), 0.0f);
  EXPECT_EQ(Mxfp4Element(row1, row1_scales, 63), -24.0f);
}

}  // namespace
}  // namespace k3
