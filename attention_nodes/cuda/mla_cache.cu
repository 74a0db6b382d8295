// mla_cache.h: the launch and its shape checks; the device code is mla_cache_kernel.inc.
#include "attention_nodes/cuda/mla_cache.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_bf16.cuh"
#include "attention_nodes/cuda/mla_cache_kernel.inc"

namespace k3 {

int LaunchMlaCacheWrite(const MlaCacheWrite& write, void* stream) {
  if (write.rows < 1 || write.width < 1 || write.page_size < 1 || write.max_pages < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  MlaCacheWriteKernel<<<write.rows, kMlaCacheThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      write);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
