// DeviceExperts: an expert node's routed experts computed on an accelerator instead of by
// RunExperts on the CPU (`k3serve expert --device cuda:N`; docs/GPU.md).
//
// The node's ExpertWorker hands it each set of weights it holds (one per placement version that
// loaded its own), and forgets them when no held version uses them any more; the device keeps a
// copy of every MoE layer's hosted experts of each set until then. Run has RunExperts' contract.
//
// Thread-compatible: the expert node's actor is its one caller.
#ifndef K3SERVE_EXPERT_NODES_DEVICE_EXPERTS_H_
#define K3SERVE_EXPERT_NODES_DEVICE_EXPERTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/compute_device.h"
#include "model/weights.h"
#include "moe/expert_assignment.h"

namespace k3 {

class DeviceExperts {
 public:
  virtual ~DeviceExperts() = default;
  // Copies every MoE layer's hosted experts of `weights` to the device (again: a no-op).
  // InvalidArgument for experts the device cannot take (the GPU: MXFP4 only), ResourceExhausted
  // or Internal when the copy fails.
  virtual absl::Status Add(const ModelWeights& weights) = 0;
  // Frees what Add copied from `weights`.
  virtual void Forget(const ModelWeights& weights) = 0;
  // RunExperts for model layer `layer` with the experts Add copied from `weights`;
  // FailedPrecondition if they were not added.
  virtual absl::Status Run(const ModelWeights& weights, int layer, const float* z, int64_t rows,
                           int64_t width, const std::vector<ExpertAssignment>& assignments,
                           float* out) = 0;
  // Run with z and out in the device's memory: the rows of a request that arrived on a device
  // channel (cluster/device_channel.h) and the answer to send back on one. Returns when out is
  // written. Unimplemented where the device cannot take device rows.
  virtual absl::Status RunDeviceRows(const ModelWeights& weights, int layer, const float* z,
                                     int64_t rows, int64_t width,
                                     const std::vector<ExpertAssignment>& assignments,
                                     float* out) = 0;
  // Device memory for one request's rows and its answer, `floats` floats each, owned here and
  // valid until the next call (the buffers grow to the largest request).
  struct RowBuffers {
    float* rows = nullptr;
    float* answer = nullptr;
  };
  virtual absl::StatusOr<RowBuffers> ReserveRowBuffers(int64_t floats) = 0;
  // Device bytes of the copied weights.
  virtual int64_t weight_bytes() const = 0;
};

// The DeviceExperts for `device` (null for the CPU). Unavailable when this build has no CUDA or
// the device is not there.
absl::StatusOr<std::unique_ptr<DeviceExperts>> MakeDeviceExperts(const ComputeDevice& device);

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_DEVICE_EXPERTS_H_
