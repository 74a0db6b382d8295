#include "expert_nodes/device_experts.h"

#include "absl/strings/str_cat.h"

#ifdef K3SERVE_CUDA
#include "expert_nodes/gpu_device_experts.h"
#endif

namespace k3 {

absl::StatusOr<std::unique_ptr<DeviceExperts>> MakeDeviceExperts(const ComputeDevice& device) {
  if (device.cuda < 0) return std::unique_ptr<DeviceExperts>();
#ifdef K3SERVE_CUDA
  return MakeGpuDeviceExperts(device.cuda);
#else
  return absl::UnavailableError(absl::StrCat(
      "--device ", ComputeDeviceName(device),
      ": this k3serve was built without the CUDA Toolkit (docs/GPU.md)"));
#endif
}

}  // namespace k3
