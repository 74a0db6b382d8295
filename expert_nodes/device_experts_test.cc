#include "expert_nodes/device_experts.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(ExpertDeviceTest, ParsesCpuAndCudaDevices) {
  EXPECT_EQ(*ParseExpertDevice("cpu"), ExpertDevice{});
  EXPECT_EQ(*ParseExpertDevice("cuda"), ExpertDevice{0});
  EXPECT_EQ(*ParseExpertDevice("cuda:3"), ExpertDevice{3});
  EXPECT_EQ(ExpertDeviceName(ExpertDevice{3}), "cuda:3");
  EXPECT_EQ(ExpertDeviceName(ExpertDevice{}), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "CPU", ""}) {
    absl::StatusOr<ExpertDevice> device = ParseExpertDevice(bad);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(device.status().message().find("is not cpu, cuda or cuda:N"), std::string::npos)
        << device.status();
  }
}

TEST(ExpertDeviceTest, CpuNeedsNoDeviceObject) {
  absl::StatusOr<std::unique_ptr<DeviceExperts>> cpu = MakeDeviceExperts(ExpertDevice{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(*cpu, nullptr);
}

// No machine has a thousand GPUs: the error says why, whether or not this build has CUDA.
TEST(ExpertDeviceTest, AMissingGpuIsUnavailableWithItsReason) {
  absl::StatusOr<std::unique_ptr<DeviceExperts>> gpu = MakeDeviceExperts(ExpertDevice{1000});
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(gpu.status().message());
  EXPECT_TRUE(message.find("no GPU") != std::string::npos ||
              message.find("built without the CUDA Toolkit") != std::string::npos)
      << message;
}

}  // namespace
}  // namespace k3
