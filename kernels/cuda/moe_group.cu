// The device grouping (moe_group.h): the launches and their checks; the device code is
// moe_group_kernel.inc.
#include "kernels/cuda/moe_group.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe_group_kernel.inc"

namespace k3 {

int LaunchMoeGroup(const MoeGroupArgs& args, void* stream) {
  if (args.rows < 1 || args.top_k < 1 || args.num_experts < 1 ||
      args.num_experts > kMoeGroupMaxExperts ||
      (args.chunk_tokens != 8 && args.chunk_tokens != 16 && args.chunk_tokens != 32) ||
      args.max_chunks <
          MoeGroupMaxChunks(args.rows, args.top_k, args.num_experts, args.chunk_tokens)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  MoeGroupKernel<<<1, kMoeGroupThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

int LaunchMoeGatherRows(const float* z, int32_t width, const int32_t* slot_row, int32_t slots,
                        uint16_t* x, void* stream) {
  if (slots < 1 || width < 1) return static_cast<int>(cudaErrorInvalidValue);
  MoeGatherRowsKernel<<<slots, kMoeGroupThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      z, width, slot_row, x);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
