// RMSNorm (rms_norm.h): one block of 256 threads per row; thread t handles columns t, t + 256, ...
// (a warp reads 128 contiguous bytes), the sum of squares meets in a block reduction, then each
// thread scales its own columns (so y may be x).
#include "attention_nodes/cuda/rms_norm.h"

#include <cuda_runtime.h>

#include "attention_nodes/cuda/block_reduce.cuh"

namespace k3 {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const float* x, int64_t x_stride, int width, const float* gamma, float eps,
                  float* y, int64_t y_stride) {
  __shared__ float slots[kThreads / 32];
  const float* row = x + blockIdx.x * x_stride;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < width; i += kThreads) squares += row[i] * row[i];
  const float inverse = 1.0f / sqrtf(BlockSum(squares, slots) / width + eps);
  float* out = y + blockIdx.x * y_stride;
  for (int i = threadIdx.x; i < width; i += kThreads) out[i] = row[i] * inverse * gamma[i];
}

}  // namespace

int LaunchRmsNorm(const float* x, int64_t x_stride, int32_t rows, int32_t width,
                  const float* gamma, float eps, float* y, int64_t y_stride, void* stream) {
  if (rows < 1 || width < 1 || x_stride < width || y_stride < width) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  RmsNormKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, x_stride, width,
                                                                          gamma, eps, y, y_stride);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
