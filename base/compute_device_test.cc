#include "base/compute_device.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(ComputeDeviceTest, ParsesCpuAndCudaDevices) {
  EXPECT_EQ(*ParseComputeDevice("cpu"), ComputeDevice{});
  EXPECT_EQ(*ParseComputeDevice("cuda"), ComputeDevice{0});
  EXPECT_EQ(*ParseComputeDevice("cuda:3"), ComputeDevice{3});
  EXPECT_EQ(ComputeDeviceName(ComputeDevice{3}), "cuda:3");
  EXPECT_EQ(ComputeDeviceName(ComputeDevice{}), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "CPU", ""}) {
    absl::StatusOr<ComputeDevice> device = ParseComputeDevice(bad);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(device.status().message().find("is not cpu, cuda or cuda:N"), std::string::npos)
        << device.status();
  }
}

}  // namespace
}  // namespace k3
