// RoutedMoe: the routed half of a MoE layer as the attention side sees it. The attention worker
// hands over the full-width rows (post_attention_layernorm output), computes the shared experts
// while the answer is in flight, then reads one row per token back:
//   LatentMoE (K3):  u = RMSNorm(Σ_j w_j E_j(W↓ x))  [tokens, routed_expert_hidden_size]
//   Kimi Linear:     u = Σ_j w_j E_j(x)               [tokens, hidden_size] (scaling included)
// The attention side then applies routed_expert_up_proj (LatentMoE) and adds the shared experts.
//
// Layers in flight: at most Concurrency() at once. With more than one (ping-pong micro-batches: the
// attention worker computes one micro-batch while the other's routed answer is in flight), Waits
// answer the layers in the order they were begun. After an error from Begin or Wait every layer
// in flight is abandoned (the caller fails the step).
//
// Thread-safety: one thread calls Begin and Wait.
#ifndef K3SERVE_MOE_ROUTED_MOE_H_
#define K3SERVE_MOE_ROUTED_MOE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "base/trace_context.h"

namespace k3 {

class RoutedMoe {
 public:
  virtual ~RoutedMoe() = default;
  // Starts layer `layer` for rows x [tokens, hidden_size]; x stays valid until Wait returns.
  virtual absl::Status Begin(int layer, const float* x, int64_t tokens) = 0;
  // Writes the answer of the oldest layer begun and not yet waited for to out [tokens,
  // ExpertWidth()]. Errors (a dead worker, a deadline) name the cause; the step is then abandoned.
  virtual absl::Status Wait(float* out) = 0;
  // How many layers may be in flight at once (Begin again before Wait).
  virtual int Concurrency() const { return 1; }
  // Drops every layer in flight (the caller failed the step for a reason of its own); answers
  // that arrive for them later are discarded. Nothing to do where Wait always follows Begin.
  virtual void Abandon() {}
  // The trace contexts (base/trace_context.h) of the traced requests among the rows of the
  // layers begun from now on, each under its step's span; empty: none. A remote implementation
  // sends them with the rows, so the other tiers record their spans of these requests.
  virtual void SetTraces(std::vector<TraceContext> traces) {}
};

}  // namespace k3

#endif  // K3SERVE_MOE_ROUTED_MOE_H_
