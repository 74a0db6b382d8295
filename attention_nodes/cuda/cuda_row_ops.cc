#include "attention_nodes/cuda/cuda_row_ops.h"

#include <cuda_runtime.h>

#include "base/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace k3 {

absl::Status CudaRowOps::CopyToHost(const void* device, void* host, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s),
                          "cudaMemcpyAsync(routing to the host)");
  return Synchronize(stream);
}

absl::Status CudaRowOps::Synchronize(void* stream) {
  K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                          "cudaStreamSynchronize");
  return absl::OkStatus();
}

absl::Status CudaRowOps::Zero(float* out, int64_t n, void* stream) {
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(out, 0, static_cast<size_t>(n) * sizeof(float),
                      static_cast<cudaStream_t>(stream)),
      "cudaMemsetAsync");
  return absl::OkStatus();
}

absl::Status CudaRowOps::Add(const float* x, float* out, int64_t n, void* stream) {
  if (products_ == nullptr) {
    K3_ASSIGN_OR_RETURN(products_, CublasProducts::Create(stream));
  }
  if (products_->stream() != stream) {
    return absl::InternalError("CudaRowOps: Add on another stream than its first");
  }
  return products_->Add(x, out, n);
}

absl::StatusOr<float*> CudaRowOps::Scratch(int index, int64_t floats) {
  if (index < 0) return absl::InvalidArgumentError("CudaRowOps: negative scratch index");
  if (scratch_.size() <= static_cast<size_t>(index)) scratch_.resize(index + 1);
  K3_RETURN_IF_ERROR(scratch_[index].Reserve(static_cast<size_t>(floats)));
  return scratch_[index].get();
}

}  // namespace k3
