// ComputeDevice: where a process computes, as its `--device` flag names it: the CPU ("cpu") or a
// CUDA device ("cuda", device 0, or "cuda:N"). The expert, attention and single-process commands
// share the syntax. A plain value; thread-compatible.
#ifndef K3SERVE_BASE_COMPUTE_DEVICE_H_
#define K3SERVE_BASE_COMPUTE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"

namespace k3 {

struct ComputeDevice {
  int cuda = -1;  // the CUDA device index; -1: the CPU
  bool operator==(const ComputeDevice&) const = default;
};

// "cpu", "cuda" (device 0) or "cuda:N"; InvalidArgument for anything else.
absl::StatusOr<ComputeDevice> ParseComputeDevice(const std::string& text);
std::string ComputeDeviceName(const ComputeDevice& device);

}  // namespace k3

#endif  // K3SERVE_BASE_COMPUTE_DEVICE_H_
