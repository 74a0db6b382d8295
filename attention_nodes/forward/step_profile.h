// StepProfile: where one model step's time went (StepRunner::last_profile): the whole step, and
// of it the time waiting on the MoE layers' routed answers. The scheduler's metrics and the step
// benchmarks read it.
//
// Thread-safety: a plain value.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_STEP_PROFILE_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_STEP_PROFILE_H_

#include <vector>

#include "absl/time/time.h"

namespace k3 {

// The MoE wait is the time spent inside RoutedMoe::Begin and RoutedMoe::Wait (sending the rows,
// then waiting for the routed answer: the router tier across the wire, or the routed experts
// themselves in process); the shared experts computed while the answer is in flight count as
// compute.
struct StepProfile {
  absl::Duration total = absl::ZeroDuration();     // the whole Step
  bool ping_pong = false;                          // ran as two micro-batches
  absl::Duration moe_wait = absl::ZeroDuration();  // over every MoE layer
  std::vector<absl::Duration> layer_moe_wait;      // one per MoE layer the step ran, in order
  // Attention, Block AttnRes, the dense layer, shared experts, up projection and LM head.
  absl::Duration compute() const { return total - moe_wait; }
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_STEP_PROFILE_H_
