// A sum over a block's threads, for the row kernels of this package (RMSNorm, AttnRes). Included
// by .cu files only.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_BLOCK_REDUCE_CUH_
#define K3SERVE_ATTENTION_NODES_CUDA_BLOCK_REDUCE_CUH_

namespace k3 {

// The sum of `value` over the block's threads, returned to every thread. `slots` is shared memory
// of at least blockDim.x / 32 floats. blockDim.x must be a multiple of 32; every thread of the
// block must call it (it synchronizes twice, so `slots` may be reused right after).
__device__ inline float BlockSum(float value, float* slots) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) slots[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += slots[w];  // the same order in every thread
  __syncthreads();
  return total;
}

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_BLOCK_REDUCE_CUH_
