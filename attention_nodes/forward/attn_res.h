// Block AttnRes, the depth attention of spec §4.1: at each token position a softmax over the
// depth sources (completed blocks, then the running prefix) of wᵀ RMSNorm_γ(V_i), mixing the RAW
// sources. fp32 throughout.
//
// Thread-safety: a pure function of its arguments; work is split across the kernel thread pool.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_ATTN_RES_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_ATTN_RES_H_

#include <cstdint>

#include "absl/types/span.h"

namespace k3 {

// For each row t in [0, rows):
//   e_i    = Σ_k V_i[t,k] γ_k w_k / sqrt(mean_k(V_i[t,k]²) + eps)
//   out[t] = Σ_i softmax_i(e)_i · V_i[t]
// sources: the n >= 1 sources V_i, each [rows, dim] row-major. proj: w [dim] (the Linear(d→1)
// weight); norm: γ [dim]; eps: rms_norm_eps. out: [rows, dim]; it may be one of the sources (every
// row's scores are taken before the row is written).
void AttnResRead(absl::Span<const float* const> sources, int64_t rows, int64_t dim,
                 const float* proj, const float* norm, float eps, float* out);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_ATTN_RES_H_
