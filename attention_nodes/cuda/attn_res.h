// Block AttnRes on a GPU (spec §4.1, the GPU twin of attention_nodes/forward/attn_res.h): for each
// row t,
//   e_i    = Σ_k V_i[t,k] γ_k w_k / sqrt(mean_k(V_i[t,k]²) + eps)
//   out[t] = Σ_i softmax_i(e)_i · V_i[t]
// over n depth sources, fp32, one block per row. out may be one of the sources.
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_ATTN_RES_H_
#define K3SERVE_ATTENTION_NODES_CUDA_ATTN_RES_H_

#include <cstdint>

namespace k3 {

// The most sources one call takes (K3 has ceil(layers / block) + 1, about 10).
inline constexpr int kAttnResMaxSources = 64;

// sources: a device array of n device pointers, each to [rows, dim] row-major; proj: w [dim];
// norm: γ [dim]; out: [rows, dim]. Enqueues one launch on `stream` (a cudaStream_t; nullptr for
// the legacy stream) and returns its cudaError_t (0: enqueued); n outside 1..kAttnResMaxSources,
// rows < 1 or dim < 1 returns cudaErrorInvalidValue (1) with nothing enqueued.
int LaunchAttnRes(const float* const* sources, int32_t n, int32_t rows, int32_t dim,
                  const float* proj, const float* norm, float eps, float* out, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_ATTN_RES_H_
