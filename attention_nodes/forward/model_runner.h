// ModelRunner: the attention worker's forward pass (spec §4): embedding, the KDA and MLA mixers with
// their per-request state, Block AttnRes (or the plain residual of Kimi Linear), the dense layer 0,
// the shared experts, the latent up projection and the LM head. The routed experts are reached
// through a RoutedMoe, in process or across the router tier; the math is the same either way.
//
// One Step runs a batch of sequences, each appending any number of tokens (a prefill chunk or one
// decode token): rows of all sequences share every matrix product, while the mixers run per
// sequence over its own KdaState / MlaCache.
//
// Ping-pong micro-batches (MegaScale-Infer's, between attention and expert nodes): when the
// RoutedMoe keeps two layers in flight (the router tier) and a step has two or more sequences, the
// batch is cut into two micro-batches of about equal rows, and their layers interleave: while one
// micro-batch's routed answer is on the wire and in the router and expert tiers, this thread
// computes the other's attention. Each sequence's math is the same as in one batch. Whether it
// pays depends on where the other tiers run, so by default it is measured (PingPongChooser).
//
// Thread-safety: not thread-safe; one owner thread calls Step. The weights and the RoutedMoe are
// borrowed and must outlive the runner; SequenceStates are owned by the caller.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_MODEL_RUNNER_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/kda.h"
#include "attention_nodes/forward/mla.h"
#include "attention_nodes/forward/ping_pong_chooser.h"
#include "attention_nodes/forward/step_runner.h"
#include "base/trace_context.h"
#include "kernels/gated_mlp.h"
#include "model/weights.h"
#include "moe/routed_moe.h"

namespace k3 {

class ModelRunner final : public StepRunner {
 public:
  ModelRunner(const ModelWeights* weights, RoutedMoe* routed_moe);

  // When steps run as two ping-pong micro-batches (kMeasured by default); only where the
  // RoutedMoe's Concurrency() is 2 or more and the step has two or more sequences.
  void set_ping_pong(PingPong mode) override { ping_pong_ = mode; }

  // A fresh state on the host; NewState's form that cannot fail.
  std::unique_ptr<SequenceState> NewSequence() const;
  absl::StatusOr<std::unique_ptr<SequenceState>> NewState() override { return NewSequence(); }
  bool host_state() const override { return true; }

  // Appends each entry's tokens to its sequence and writes logits rows: per entry in order, every
  // new token's row (all_logits) or only the last one; [rows, vocab] in total. Token ids are
  // checked against the vocabulary. On error the sequences of this batch are left in an
  // unspecified state and must be dropped.
  absl::Status Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) override;

  const ModelConfig& config() const override { return weights_->config; }

  // The last Step's profile (a failed Step's up to its failure; empty before any Step).
  const StepProfile& last_profile() const override { return profile_; }

 private:
  // Part of a step's batch, with the buffers of its residual stream.
  struct MicroBatch {
    absl::Span<const BatchEntry> entries;
    int64_t rows = 0;
    std::vector<std::vector<float>> blocks;  // completed AttnRes blocks, each [rows, d]
    std::vector<float> prefix, hidden, normed, mixed, ffn, routed;
    absl::Duration moe_begin = absl::ZeroDuration();  // in RoutedMoe::Begin for the open layer
  };

  absl::Status StepLayers(absl::Span<const BatchEntry> batch, std::vector<float>* logits);
  bool CanPingPong(absl::Span<const BatchEntry> batch) const;
  static int64_t Rows(absl::Span<const BatchEntry> batch);
  void Embed(MicroBatch& mb);
  // Layer `layer` up to the routed answer: the mixing sublayer, then the FFN's norm, the routed
  // rows sent (RoutedMoe::Begin) and the shared experts (or the dense MLP).
  absl::Status StartLayer(MicroBatch& mb, int layer);
  // The rest of the layer: the routed answer (RoutedMoe::Wait), its up projection, the residual.
  absl::Status FinishLayer(MicroBatch& mb, int layer);
  // The final depth read and norm of the rows whose logits are wanted, into `selected` [.., d];
  // returns how many rows it wrote.
  int64_t SelectOutputRows(MicroBatch& mb, float* selected);
  // Depth attention over the completed blocks and the current prefix.
  void DepthRead(MicroBatch& mb, const std::vector<float>& proj, const std::vector<float>& norm,
                 float* out);

  const ModelWeights* weights_;
  RoutedMoe* routed_moe_;
  GluParams glu_;
  PingPong ping_pong_ = PingPong::kMeasured;
  PingPongChooser ping_pong_chooser_;
  StepProfile profile_;
  bool traced_ = false;  // some entry of the current step carries a trace context

  // Per-step buffers, kept to avoid allocating on every decode step.
  MicroBatch micro_batches_[2];
  std::vector<float> mlp_scratch_, selected_;
  std::vector<const float*> sources_;
  Scratch mixer_scratch_;
  std::vector<KdaSegment> kda_segments_;
  std::vector<MlaSegment> mla_segments_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_MODEL_RUNNER_H_
