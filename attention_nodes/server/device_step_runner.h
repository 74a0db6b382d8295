// MakeStepRunner: the StepRunner an attention worker steps on for its `--device`: ModelRunner on
// the CPU, or GpuStepRunner (cuda/gpu_step_runner.h) on CUDA device N where this build has the
// CUDA Toolkit.
#ifndef K3SERVE_ATTENTION_NODES_SERVER_DEVICE_STEP_RUNNER_H_
#define K3SERVE_ATTENTION_NODES_SERVER_DEVICE_STEP_RUNNER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "attention_nodes/moe_client/remote_device_experts.h"
#include "attention_nodes/forward/step_runner.h"
#include "base/compute_device.h"
#include "model/weights.h"
#include "moe/routed_moe.h"

namespace k3 {

// How much sequence state a device runner keeps (the CPU's grows as needed and ignores this).
struct DeviceStateLimits {
  int sequences = 64;  // states held at once: the scheduler's max_sequences
  // Tokens a sequence may reach (prompt and generated); with `sequences`, sizes the MLA cache.
  int64_t context_tokens = 36864;
  // MLA cache pages of 64 tokens, shared by all sequences; 0: sequences x context_tokens' worth.
  int64_t cache_pages = 0;
};

// Unavailable for a CUDA device in a build without the CUDA Toolkit or on a machine without that
// device; otherwise the runner's own errors. `weights` and `routed_moe` must outlive the runner.
// With `remote_experts` (a CUDA device only; ignored on the CPU), MoE layers go GPU to GPU to the
// expert nodes it reaches and through `routed_moe` when that fails (GpuStepRunner::Create); it
// must outlive the runner too.
absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(
    const ComputeDevice& device, const ModelWeights* weights, RoutedMoe* routed_moe,
    const DeviceStateLimits& limits, RemoteDeviceExperts* remote_experts = nullptr);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SERVER_DEVICE_STEP_RUNNER_H_
