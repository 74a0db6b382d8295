// SequenceState: everything a sequence carries from one model step to the next (spec §4): each
// KDA layer's recurrent state, each MLA layer's latent cache and the tokens consumed so far, or
// a device runner's handle where the state lives off the host. The scheduler owns one per
// request; a StepRunner (step_runner.h) makes them and steps them; the prefix cache copies the
// host ones.
//
// Thread-safety: a plain value, used by one thread at a time (the scheduler's actor).
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_SEQUENCE_STATE_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_SEQUENCE_STATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention_nodes/forward/kda.h"
#include "attention_nodes/forward/mla.h"

namespace k3 {

struct SequenceState {
  std::vector<KdaState> kda;  // per layer; unused entries for MLA layers stay empty
  std::vector<MlaCache> mla;  // per layer; unused entries for KDA layers stay empty
  int64_t length = 0;         // tokens consumed so far
  // Where a runner keeps the state off the host (GpuStepRunner: the sequence's device slot and
  // cache pages), kda and mla stay empty and this holds the runner's handle; the runner's share
  // goes back to it when the last holder lets go.
  std::shared_ptr<void> device;

  size_t ByteSize() const;  // host bytes
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_SEQUENCE_STATE_H_
