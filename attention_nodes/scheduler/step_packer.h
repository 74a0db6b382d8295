// StepPacker: which tokens one model step of the attention worker computes.
//
// A pure function of the running sequences' progress and the step's limits: it reads no clock and
// owns no state but a rotating decode cursor, so its policy is unit-tested without processes or
// timing (the timing lives in StepBudget, step_budget.h, which says how many prompt tokens a step
// may take).
//
// The policy, in order:
//   1. one decode token for every sequence that has consumed its prompt; if there are more than
//      the step's token limit allows (less a floor kept for prompts while any wait), a rotating
//      window of them, so none starves;
//   2. the prompt budget (at most what the limit leaves) goes to prompts, as prefill chunks:
//      a. the oldest prompt (arrival order) gets half of it (at least a token), so every prompt
//         progresses whatever arrives after it;
//      b. then every prompt whose rest fits whole in what is left, shortest first: it completes
//         and gets its first token in this step (a short prompt never queues behind a long one,
//         and the step stays within the budget, so running streams' inter-token latency stays
//         bounded);
//      c. what is left, in arrival order.
//   A chunk that does not complete its prompt ends at a multiple of `granule` tokens into the
//   prompt when it can (KDA's chunk: whole chunks are what the prefix cache can snapshot), so a
//   prompt is cut at the same places whatever it is batched with; with `chunk` set, always at a
//   multiple of that. Where a prompt is cut does not change its tokens.
//
// Not thread-safe (the scheduler thread owns it).
#ifndef K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_PACKER_H_
#define K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_PACKER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace k3 {

// One running sequence as the packer sees it, in admission order.
struct PackInput {
  int64_t prompt_tokens = 0;
  int64_t consumed = 0;  // prompt tokens already fed to the model; == prompt_tokens: decoding
  bool decoding() const { return consumed >= prompt_tokens; }
};

struct PackLimits {
  int64_t max_tokens = 2048;    // tokens the step computes at most (decode and prefill), >= 1
  int64_t prompt_budget = 0;    // prompt tokens the step may take (StepBudget), >= 0
  int64_t prompt_floor = 1;     // kept for prompts when decode tokens alone would fill max_tokens
  int64_t granule = 16;         // partial chunks end at multiples of this into the prompt, >= 1
  // > 0: partial chunks always end at a multiple of this (KDA's chunk grid, so that a prompt's
  // KDA state does not depend on where it was cut: batch invariance), taking up to chunk - 1
  // tokens past the budget where the budget would cut inside the first chunk; a divisor of
  // granule. 0: only where they can.
  int64_t chunk = 0;
};

struct PrefillChunk {
  size_t index;    // into the PackInput span
  int64_t tokens;  // >= 1
  bool completes;  // the chunk ends the prompt: the step's logits row yields the first token
};

struct StepPack {
  std::vector<size_t> decode;         // indices of sequences that decode one token
  std::vector<PrefillChunk> prefill;  // in arrival order
  int64_t decode_tokens() const { return static_cast<int64_t>(decode.size()); }
  int64_t prefill_tokens() const;
  int64_t tokens() const { return decode_tokens() + prefill_tokens(); }
};

class StepPacker {
 public:
  // Packs one step over `running` (admission order). Deterministic: the same inputs and cursor
  // give the same pack; the decode cursor advances past the window it took.
  StepPack Pack(absl::Span<const PackInput> running, const PackLimits& limits);

 private:
  size_t decode_cursor_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SCHEDULER_STEP_PACKER_H_
