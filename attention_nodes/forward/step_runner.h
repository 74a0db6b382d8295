// StepRunner: what the GenerationScheduler needs of a forward pass (spec §4): fresh per-sequence
// states (sequence_state.h) and model steps over a batch of sequences (BatchEntry), each appending
// a prefill chunk or one decode token, with a profile of where the step's time went
// (step_profile.h). ModelRunner (model_runner.h) runs it on the CPU; GpuStepRunner
// (attention_nodes/cuda/gpu_step_runner.h) on a CUDA device, with the states in device memory;
// MakeStepRunner (attention_nodes/server/device_step_runner.h) picks one for a --device.
//
// Thread-safety: implementations are not thread-safe; one owner thread (the scheduler's actor)
// calls NewState and Step and lets states go. config() is immutable and may be read from any
// thread. States must not outlive their runner's owner's use of the runner (a GPU runner's handle
// stays valid but inert after the runner is gone).
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_STEP_RUNNER_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_STEP_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/sequence_state.h"
#include "attention_nodes/forward/step_profile.h"
#include "base/trace_context.h"
#include "model/config.h"

namespace k3 {

// One sequence's part of a Step.
struct BatchEntry {
  SequenceState* state = nullptr;
  absl::Span<const int32_t> tokens;  // tokens to append; at least one
  bool all_logits = false;           // logits for every new token, or only for the last
  // The sequence's trace context for this step (under its step span), when its request is
  // traced: it goes with the MoE rows of the micro-batch holding this entry (RoutedMoe::SetTraces).
  const TraceContext* trace = nullptr;
};

// Whether a Step may cut its batch into two interleaved micro-batches (set_ping_pong).
enum class PingPong {
  kOff,       // always one batch
  kAlways,    // two micro-batches whenever the step has two sequences (tests, benchmarks)
  kMeasured,  // whichever of the two PingPongChooser measures faster
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  virtual const ModelConfig& config() const = 0;

  // A fresh sequence (zero state, length 0). ResourceExhausted when the runner has no room for
  // another (a GPU runner's state slots).
  virtual absl::StatusOr<std::unique_ptr<SequenceState>> NewState() = 0;

  // Appends each entry's tokens to its sequence and writes logits rows: per entry in order, every
  // new token's row (all_logits) or only the last one; [rows, vocab] in total. Token ids are
  // checked against the vocabulary. On error the sequences of this batch are left in an
  // unspecified state and must be dropped.
  virtual absl::Status Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) = 0;

  // The last Step's profile (a failed Step's up to its failure; empty before any Step).
  virtual const StepProfile& last_profile() const = 0;

  // Whether steps may run as two ping-pong micro-batches; runners that cannot ignore it.
  virtual void set_ping_pong(PingPong mode) = 0;

  // Whether SequenceState's kda and mla hold the state on the host (the prefix cache copies them).
  virtual bool host_state() const = 0;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_STEP_RUNNER_H_
