#include "attention_nodes/server/device_step_runner.h"

#include <string>

#include "gtest/gtest.h"
#include "model/config.h"

namespace k3 {
namespace {

// The runners read only the config before a step.
ModelWeights TinyTestWeights() {
  ModelWeights weights;
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  weights.config = *config;
  return weights;
}

TEST(MakeStepRunnerTest, TheCpuGetsAModelRunnerWithHostStates) {
  const ModelWeights weights = TinyTestWeights();
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      MakeStepRunner(ComputeDevice{}, &weights, /*routed_moe=*/nullptr, DeviceStateLimits{});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_TRUE((*runner)->host_state());
  absl::StatusOr<std::unique_ptr<SequenceState>> state = (*runner)->NewState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ((*state)->length, 0);
  EXPECT_EQ((*state)->kda.size(), static_cast<size_t>(weights.config.num_hidden_layers));
  EXPECT_EQ((*state)->device, nullptr);
}

// No machine has a thousand GPUs: the error says why, whether or not this build has CUDA.
TEST(MakeStepRunnerTest, AMissingGpuIsUnavailableWithItsReason) {
  const ModelWeights weights = TinyTestWeights();
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      MakeStepRunner(ComputeDevice{1000}, &weights, nullptr, DeviceStateLimits{});
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(runner.status().message());
  EXPECT_TRUE(message.find("no CUDA device 1000") != std::string::npos ||
              message.find("no GPU") != std::string::npos ||
              message.find("built without the CUDA Toolkit") != std::string::npos)
      << message;
}

TEST(MakeStepRunnerTest, RefusesEmptyLimitsForADevice) {
  const ModelWeights weights = TinyTestWeights();
  DeviceStateLimits limits;
  limits.sequences = 0;
  EXPECT_EQ(MakeStepRunner(ComputeDevice{0}, &weights, nullptr, limits).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
