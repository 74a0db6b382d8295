#include "kernels/kernel_isa.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(KernelIsaTest, ParsesTheNamesItPrints) {
  for (KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    EXPECT_EQ(ParseKernelIsa(KernelIsaName(isa)), isa);
  }
  EXPECT_EQ(ParseKernelIsa("AVX2"), std::nullopt);
  EXPECT_EQ(ParseKernelIsa("sse4"), std::nullopt);
  EXPECT_EQ(ParseKernelIsa(""), std::nullopt);
}

TEST(KernelIsaTest, LowerFamiliesAreSupportedWhereHigherOnesAre) {
  EXPECT_TRUE(CpuSupports(KernelIsa::kPortable));
  if (CpuSupports(KernelIsa::kAvx512)) {
    EXPECT_TRUE(CpuSupports(KernelIsa::kAvx2));
  }
  EXPECT_TRUE(CpuSupports(ActiveKernelIsa()));
}

}  // namespace
}  // namespace k3
