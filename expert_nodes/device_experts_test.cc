#include "expert_nodes/device_experts.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(ExpertDeviceTest, CpuNeedsNoDeviceObject) {
  absl::StatusOr<std::unique_ptr<DeviceExperts>> cpu = MakeDeviceExperts(ComputeDevice{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(*cpu, nullptr);
}

// No machine has a thousand GPUs: the error says why, whether or not this build has CUDA.
TEST(ExpertDeviceTest, AMissingGpuIsUnavailableWithItsReason) {
  absl::StatusOr<std::unique_ptr<DeviceExperts>> gpu = MakeDeviceExperts(ComputeDevice{1000});
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(gpu.status().message());
  EXPECT_TRUE(message.find("no GPU") != std::string::npos ||
              message.find("built without the CUDA Toolkit") != std::string::npos)
      << message;
}

}  // namespace
}  // namespace k3
