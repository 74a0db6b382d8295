// DeviceExperts on a CUDA GPU: a GpuExpertCompute per (weights, MoE layer). Built only where the
// CUDA Toolkit is installed (expert_nodes/device_experts.cc calls it then).
#ifndef K3SERVE_EXPERT_NODES_GPU_DEVICE_EXPERTS_H_
#define K3SERVE_EXPERT_NODES_GPU_DEVICE_EXPERTS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "expert_nodes/device_experts.h"

namespace k3 {

// Unavailable when CUDA sees no device `device`.
absl::StatusOr<std::unique_ptr<DeviceExperts>> MakeGpuDeviceExperts(int device);

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_GPU_DEVICE_EXPERTS_H_
