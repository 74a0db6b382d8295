#include "attention_nodes/server/device_step_runner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention_nodes/forward/model_runner.h"

#ifdef K3SERVE_CUDA
#include "attention_nodes/cuda/gpu_step_runner.h"
#endif

namespace k3 {

absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(
    const ComputeDevice& device, const ModelWeights* weights, RoutedMoe* routed_moe,
    const DeviceStateLimits& limits, RemoteDeviceExperts* remote_experts) {
  if (device.cuda < 0) return std::make_unique<ModelRunner>(weights, routed_moe);
  if (limits.sequences < 1 || limits.context_tokens < 1 || limits.cache_pages < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device state limits need sequences >= 1 (", limits.sequences, "), context_tokens >= 1 (",
        limits.context_tokens, ") and cache_pages >= 0 (", limits.cache_pages, ")"));
  }
#ifdef K3SERVE_CUDA
  GpuRunnerCapacity capacity;
  capacity.sequences = limits.sequences;
  const int64_t pages = limits.cache_pages > 0
                            ? limits.cache_pages
                            : limits.sequences * ((limits.context_tokens + capacity.page_size - 1) /
                                                  capacity.page_size);
  if (pages > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(pages, " MLA cache pages are more than the GPU runner indexes"));
  }
  capacity.cache_pages = static_cast<int32_t>(pages);
  absl::StatusOr<std::unique_ptr<GpuStepRunner>> runner =
      GpuStepRunner::Create(weights, routed_moe, device.cuda, capacity, remote_experts);
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<StepRunner>(*std::move(runner));
#else
  return absl::UnavailableError(
      absl::StrCat("--device ", ComputeDeviceName(device),
                   ": this k3serve was built without the CUDA Toolkit (docs/GPU.md)"));
#endif
}

}  // namespace k3
