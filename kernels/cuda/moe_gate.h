// The MoE gate on a GPU (spec §7.2, the GPU twin of router/gate.h's RouteTokens after its gate
// product): from each token's gate logits W_gate x, the sigmoid scores s = σ(logits), the top-k
// experts by s + e_score_correction_bias (the bias picks experts but never weights them; equal
// choices go to the lower expert id), and their weights s, renormalized over the chosen set when
// asked, times the routed scaling factor.
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_KERNELS_CUDA_MOE_GATE_H_
#define K3SERVE_KERNELS_CUDA_MOE_GATE_H_

#include <cstdint>

namespace k3 {

// The largest expert count and top-k one launch handles (K3: 896 and 16).
inline constexpr int kMoeGateMaxExperts = 1024;
inline constexpr int kMoeGateMaxTopK = 32;

struct MoeGateArgs {
  const float* logits = nullptr;  // [tokens, num_experts], row stride logits_stride
  int64_t logits_stride = 0;
  const float* bias = nullptr;  // [num_experts] e_score_correction_bias, or null
  int32_t tokens = 0;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  bool renormalize = true;
  float scaling = 1.0f;      // routed_scaling_factor
  float* scores = nullptr;   // out: [tokens, num_experts] sigmoid scores (QB statistics read them)
  int32_t* ids = nullptr;    // out: [tokens, top_k] in descending order of s + bias
  float* weights = nullptr;  // out: [tokens, top_k], matching ids
};

// Enqueues one launch on `stream` (a cudaStream_t; nullptr for the legacy stream) and returns its
// cudaError_t (0: enqueued). Shapes out of range (tokens < 1, num_experts outside
// [1, kMoeGateMaxExperts], top_k outside [1, min(num_experts, kMoeGateMaxTopK)], a stride below
// num_experts) return cudaErrorInvalidValue (1) with nothing enqueued.
int LaunchMoeGate(const MoeGateArgs& args, void* stream);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_MOE_GATE_H_
