// One KDA decode step on a GPU (spec §5, the recurrent form of attention_nodes/forward/kda.cc): for
// each sequence of a batch and each head, one fused launch does the short convolutions' decode step
// (+ SiLU), the decay gate, the sigmoid beta, the L2 norms of q and k, the gated delta rule on the
// fp32 state S [K, V] held in device memory, and the gated per-head RMSNorm of the output. The
// projections before it (q/k/v/f/b/g) and o_proj after it are plain GEMMs, not part of this file.
//
// States live in a pool of slots in device memory (continuous batching: a sequence keeps its slot
// while it decodes), each slot laid out as KdaState is on the CPU, so a slot uploads and downloads
// with one copy per array:
//   state:      [slots, H, K, V]                  fp32, key-row major (S_h[j, m] at j * V + m)
//   conv_cache: [slots, 3 (q, k, v), window, P]   fp32, the last `window` pre-conv inputs, oldest
//                                                 first (window = conv_kernel - 1, P = H * K)
//
// Plain C++ (no CUDA headers), so C++ callers include it. Every pointer is a device pointer;
// nothing is owned. The launch is asynchronous on `stream`.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_KDA_DECODE_H_
#define K3SERVE_ATTENTION_NODES_CUDA_KDA_DECODE_H_

#include <cstdint>

namespace k3 {

struct KdaDecodeLaunch {
  int32_t batch = 0;        // sequences
  int32_t heads = 0;        // H
  int32_t head_dim = 0;     // K = V: 32, 64 or 128
  int32_t conv_kernel = 0;  // short_conv_kernel_size, 1..8
  const int32_t* slots = nullptr;  // [batch]: each sequence's slot in state / conv_cache
  float* state = nullptr;          // [slots, H, K, V], read and advanced
  float* conv_cache = nullptr;     // [slots, 3, window, P], read and advanced
  // The new tokens' projections, [batch x tokens, P] each (before the convolutions).
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  // Depthwise conv weights, [P, conv_kernel] each (KdaWeights::q_conv's layout; tap
  // conv_kernel - 1 multiplies the new token).
  const float* q_conv = nullptr;
  const float* k_conv = nullptr;
  const float* v_conv = nullptr;
  const float* decay = nullptr;       // [batch x tokens, P]: f_b_proj's output f
  const float* dt_bias = nullptr;     // [P]
  const float* a_log = nullptr;       // [H]
  int32_t has_lower_bound = 1;        // 1: §5.3 option A, g = lb · σ(e^A (f + dt_bias));
  float lower_bound = -5.0f;          // 0: option B, g = −e^A softplus(f + dt_bias)
  const float* beta_logit = nullptr;  // [batch x tokens, H]: b_proj's output
  const float* gate = nullptr;        // [batch x tokens, P]: the output gate's logits
  const float* o_norm = nullptr;      // [K]: the per-head RMSNorm weight
  float eps = 1e-5f;                  // rms_norm_eps
  // New tokens per sequence, in order (1: a decode step; more: a prefill chunk, whose tokens run
  // one after another in the same launch with the state held in registers, so the state is read
  // and written once per chunk). Every per-token array holds batch x tokens rows,
  // sequence-major (row b * tokens + t); batch x tokens < 2^31.
  int32_t tokens = 1;
  float* out = nullptr;  // [batch x tokens, P]: RMSNorm(o) ⊙ o_norm ⊙ σ(gate), for o_proj
};

// Enqueues the step on `stream` (a cudaStream_t; nullptr for the legacy stream). Returns the
// cudaError_t of the launch (0: enqueued); a shape it does not handle (head_dim other than 32, 64
// or 128, conv_kernel outside 1..8, batch, tokens or heads < 1) returns cudaErrorInvalidValue (1)
// with nothing enqueued. REQUIRES: the slots of a batch are distinct.
int LaunchKdaDecode(const KdaDecodeLaunch& launch, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_KDA_DECODE_H_
