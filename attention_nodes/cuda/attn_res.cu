// Block AttnRes (attn_res.h): one block of 256 threads per row. For each source in turn, every
// thread sums v γ w and v² over its columns (t, t + 256, ...) and a block reduction gives the
// source's score; thread 0 turns the n scores into softmax weights; then each thread writes its
// own columns of Σ_i α_i V_i, having read every source's value there first (so out may alias a
// source).
#include "attention_nodes/cuda/attn_res.h"

#include <cuda_runtime.h>

#include "attention_nodes/cuda/block_reduce.cuh"

namespace k3 {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    AttnResKernel(const float* const* sources, int n, int dim, const float* proj,
                  const float* norm, float eps, float* out) {
  __shared__ float slots[kThreads / 32];
  __shared__ float alpha[kAttnResMaxSources];
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = 0; i < n; ++i) {
    const float* v = sources[i] + offset;
    float dot = 0.0f, squares = 0.0f;
    for (int k = threadIdx.x; k < dim; k += kThreads) {
      dot += v[k] * proj[k] * norm[k];
      squares += v[k] * v[k];
    }
    dot = BlockSum(dot, slots);
    squares = BlockSum(squares, slots);
    if (threadIdx.x == 0) alpha[i] = dot / sqrtf(squares / dim + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float best = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n; ++i) best = fmaxf(best, alpha[i]);
    for (int i = 0; i < n; ++i) {
      alpha[i] = expf(alpha[i] - best);
      sum += alpha[i];
    }
    for (int i = 0; i < n; ++i) alpha[i] /= sum;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < dim; k += kThreads) {
    float mixed = 0.0f;
    for (int i = 0; i < n; ++i) mixed += alpha[i] * sources[i][offset + k];
    out[offset + k] = mixed;
  }
}

}  // namespace

int LaunchAttnRes(const float* const* sources, int32_t n, int32_t rows, int32_t dim,
                  const float* proj, const float* norm, float eps, float* out, void* stream) {
  if (n < 1 || n > kAttnResMaxSources || rows < 1 || dim < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  AttnResKernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(sources, n, dim, proj,
                                                                          norm, eps, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
