// The reference's BF16/F16 decode against values written out from the formats' definitions.
#include "reference/half_bits.h"

#include <cmath>

#include "gtest/gtest.h"

namespace k3::reference {
namespace {

TEST(HalfBitsTest, Bf16) {
  EXPECT_EQ(Bf16ToDouble(0x0000), 0.0);
  EXPECT_TRUE(std::signbit(Bf16ToDouble(0x8000)));
  EXPECT_EQ(Bf16ToDouble(0x3f80), 1.0);
  EXPECT_EQ(Bf16ToDouble(0xc000), -2.0);
  EXPECT_EQ(Bf16ToDouble(0x3fc0), 1.5);
  EXPECT_EQ(Bf16ToDouble(0x4049), 3.140625);           // 0x40490fdb (pi) truncated
  EXPECT_EQ(Bf16ToDouble(0x0080), std::pow(2.0, -126));  // smallest normal
  EXPECT_EQ(Bf16ToDouble(0x0001), std::pow(2.0, -133));  // smallest subnormal
  EXPECT_EQ(Bf16ToDouble(0x7f7f), (2.0 - std::pow(2.0, -7)) * std::pow(2.0, 127));
  EXPECT_EQ(Bf16ToDouble(0x7f80), INFINITY);
  EXPECT_EQ(Bf16ToDouble(0xff80), -INFINITY);
  EXPECT_TRUE(std::isnan(Bf16ToDouble(0x7fc0)));
}

TEST(HalfBitsTest, Half) {
  EXPECT_EQ(HalfToDouble(0x3c00), 1.0);
  EXPECT_EQ(HalfToDouble(0xc000), -2.0);
  EXPECT_EQ(HalfToDouble(0x3555), 0.25 + 0x155 / 4096.0);  // 0.333251953125
  EXPECT_EQ(HalfToDouble(0x7bff), 65504.0);                 // largest finite
  EXPECT_EQ(HalfToDouble(0x0400), std::pow(2.0, -14));      // smallest normal
  EXPECT_EQ(HalfToDouble(0x0001), std::pow(2.0, -24));      // smallest subnormal
  EXPECT_EQ(HalfToDouble(0x03ff), 1023 * std::pow(2.0, -24));
  EXPECT_TRUE(std::signbit(HalfToDouble(0x8000)));
  EXPECT_EQ(HalfToDouble(0x7c00), INFINITY);
  EXPECT_TRUE(std::isnan(HalfToDouble(0x7e00)));
}

}  // namespace
}  // namespace k3::reference
