// glu.h: the launches and their shape checks; the device code is glu_kernel.inc.
#include "kernels/cuda/glu.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_bf16.cuh"
#include "kernels/cuda/glu_kernel.inc"

namespace k3 {
namespace {

bool BadShape(int64_t in_stride, int32_t rows, int32_t width, int64_t out_stride) {
  return rows < 1 || width < 1 || in_stride < width || out_stride < width;
}

// Rows beyond the grid's y limit loop in the kernels.
dim3 GluGrid(int32_t rows, int32_t width) {
  return dim3((width + kGluThreads - 1) / kGluThreads, rows < 65535 ? rows : 65535);
}

}  // namespace

int LaunchRoundToBf16(const float* x, int64_t x_stride, int32_t rows, int32_t width, uint16_t* out,
                      int64_t out_stride, void* stream) {
  if (BadShape(x_stride, rows, width, out_stride)) return static_cast<int>(cudaErrorInvalidValue);
  RoundToBf16Kernel<<<GluGrid(rows, width), kGluThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, x_stride, rows, width, out, out_stride);
  return static_cast<int>(cudaGetLastError());
}

int LaunchGluCombine(const GluParams& params, const float* gate, const float* up, int64_t in_stride,
                     int32_t rows, int32_t width, uint16_t* hidden, int64_t hidden_stride,
                     void* stream) {
  if (BadShape(in_stride, rows, width, hidden_stride)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  GluCombineKernel<<<GluGrid(rows, width), kGluThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      params, gate, up, in_stride, rows, width, hidden, hidden_stride);
  return static_cast<int>(cudaGetLastError());
}

int LaunchMulSigmoid(const float* gate, float* x, int64_t n, void* stream) {
  if (n < 1 || (n + kGluThreads - 1) / kGluThreads > 0x7fffffff) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const auto blocks = static_cast<unsigned>((n + kGluThreads - 1) / kGluThreads);
  MulSigmoidKernel<<<blocks, kGluThreads, 0, static_cast<cudaStream_t>(stream)>>>(gate, x, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
