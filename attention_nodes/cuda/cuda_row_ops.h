// CudaRowOps: RemoteDeviceExperts' device memory operations (attention_nodes/
// remote_device_experts.h) on a CUDA device: copies and zeroing with the CUDA runtime, the sum
// with cuBLAS (CublasProducts::Add) on the runner's stream.
//
// Owns its scratch buffers and cuBLAS handle. Not thread-safe: the stepping thread uses it, with
// one stream (the first one it is given).
#ifndef K3SERVE_ATTENTION_NODES_CUDA_CUDA_ROW_OPS_H_
#define K3SERVE_ATTENTION_NODES_CUDA_CUDA_ROW_OPS_H_

#include <memory>
#include <vector>

#include "attention_nodes/moe_client/remote_device_experts.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/device_buffer.h"

namespace k3 {

class CudaRowOps final : public DeviceRowOps {
 public:
  absl::Status CopyToHost(const void* device, void* host, size_t bytes, void* stream) override;
  absl::Status Synchronize(void* stream) override;
  absl::Status Zero(float* out, int64_t n, void* stream) override;
  absl::Status Add(const float* x, float* out, int64_t n, void* stream) override;
  absl::StatusOr<float*> Scratch(int index, int64_t floats) override;

 private:
  std::unique_ptr<CublasProducts> products_;  // on the first stream Add is given
  std::vector<DeviceBuffer<float>> scratch_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_CUDA_ROW_OPS_H_
