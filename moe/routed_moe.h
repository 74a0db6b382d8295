// RoutedMoe: the routed half of a MoE layer as the attention side sees it. The attention worker
// hands over the full-width rows (post_attention_layernorm output), computes the shared experts
// while the answer is in flight, then reads one row per token back:
//   LatentMoE (K3):  u = RMSNorm(Σ_j w_j E_j(W↓ x))  [tokens, routed_expert_hidden_size]
//   Kimi Linear:     u = Σ_j w_j E_j(x)               [tokens, hidden_size] (scaling included)
// The attention side then applies routed_expert_up_proj (LatentMoE) and adds the shared experts.
//
// Thread-safety: one step at a time; Begin and Wait alternate, from one thread.
#ifndef K3SERVE_MOE_ROUTED_MOE_H_
#define K3SERVE_MOE_ROUTED_MOE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace k3 {

class RoutedMoe {
 public:
  virtual ~RoutedMoe() = default;
  // Starts layer `layer` for rows x [tokens, hidden_size]; x stays valid until Wait returns.
  virtual absl::Status Begin(int layer, const float* x, int64_t tokens) = 0;
  // Writes the answer to out [tokens, ExpertWidth()]. Errors (a dead worker, a deadline) name the
  // cause; the step is then abandoned.
  virtual absl::Status Wait(float* out) = 0;
};

}  // namespace k3

#endif  // K3SERVE_MOE_ROUTED_MOE_H_
