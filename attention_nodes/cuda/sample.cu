// Token sampling (sample.h): the launch and its shape checks; the device code is
// sample_kernel.inc.
#include "attention_nodes/cuda/sample.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_nodes/cuda/sample_kernel.inc"

namespace k3 {

int LaunchSample(const float* logits, int64_t stride, int32_t rows, int32_t vocab,
                 const DeviceSamplingRow* row_params, int32_t* tokens, void* stream) {
  if (rows < 1 || vocab < 1 || stride < vocab) return static_cast<int>(cudaErrorInvalidValue);
  SampleKernel<<<rows, kSampleThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, stride, vocab, row_params, tokens);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
