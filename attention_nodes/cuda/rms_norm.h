// RMSNorm on a GPU (spec §3.1, the GPU twin of kernels/rms_norm.h):
//   y[r, :] = gamma ⊙ x[r, :] / sqrt(mean(x[r, :]²) + eps)
// fp32 in and out, one block per row. y may equal x (in place).
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_RMS_NORM_H_
#define K3SERVE_ATTENTION_NODES_CUDA_RMS_NORM_H_

#include <cstdint>

namespace k3 {

// x: [rows, width] with row stride x_stride; y: [rows, width] with row stride y_stride; gamma:
// [width]. Enqueues one launch on `stream` (a cudaStream_t; nullptr for the legacy stream) and
// returns its cudaError_t (0: enqueued); rows < 1, width < 1 or a stride below width returns
// cudaErrorInvalidValue (1) with nothing enqueued.
int LaunchRmsNorm(const float* x, int64_t x_stride, int32_t rows, int32_t width,
                  const float* gamma, float eps, float* y, int64_t y_stride, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_RMS_NORM_H_
