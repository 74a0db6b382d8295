#include "attention_nodes/forward/model_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "attention_nodes/forward/attn_res.h"
#include "base/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/matmul.h"
#include "kernels/rms_norm.h"
#include "kernels/step_profile.h"
#include "model/glu_params.h"

namespace k3 {
namespace {

// The micro-batch's sequences as the segments of a batched mixer call (MixerSegment):
// each sequence's state for `layer` (from SequenceState::kda or ::mla) and its new tokens.
// `segments` is cleared first; its capacity is reused.
template <typename Segment, typename State>
void FillSegments(absl::Span<const BatchEntry> entries, std::vector<State> SequenceState::*states,
                  int layer, std::vector<Segment>* segments) {
  segments->clear();
  for (const BatchEntry& entry : entries) {
    segments->push_back(
        Segment{&(entry.state->*states)[layer], static_cast<int64_t>(entry.tokens.size())});
  }
}

}  // namespace

ModelRunner::ModelRunner(const ModelWeights* weights, RoutedMoe* routed_moe)
    : weights_(weights), routed_moe_(routed_moe), glu_(GluParamsFor(weights->config)) {}

std::unique_ptr<SequenceState> ModelRunner::NewSequence() const {
  const ModelConfig& config = weights_->config;
  auto state = std::make_unique<SequenceState>();
  state->kda.resize(config.num_hidden_layers);
  state->mla.resize(config.num_hidden_layers);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.IsKda(l)) {
      state->kda[l] = KdaState(config);
    } else {
      state->mla[l] = MlaCache(config);
    }
  }
  return state;
}

void ModelRunner::DepthRead(MicroBatch& mb, const std::vector<float>& proj,
                            const std::vector<float>& norm, float* out) {
  const ScopedStepPart profile(StepPart::kAttnRes);
  sources_.clear();
  for (const std::vector<float>& block : mb.blocks) sources_.push_back(block.data());
  sources_.push_back(mb.prefix.data());
  AttnResRead(sources_, mb.rows, weights_->config.hidden_size, proj.data(), norm.data(),
              weights_->config.rms_norm_eps, out);
}

bool ModelRunner::CanPingPong(absl::Span<const BatchEntry> batch) const {
  return ping_pong_ != PingPong::kOff && routed_moe_->Concurrency() >= 2 && batch.size() >= 2;
}

int64_t ModelRunner::Rows(absl::Span<const BatchEntry> batch) {
  int64_t rows = 0;
  for (const BatchEntry& entry : batch) rows += static_cast<int64_t>(entry.tokens.size());
  return rows;
}

absl::Status ModelRunner::Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) {
  const absl::Time start = absl::Now();
  profile_.moe_wait = absl::ZeroDuration();
  profile_.layer_moe_wait.clear();
  profile_.ping_pong = false;
  traced_ = std::any_of(batch.begin(), batch.end(),
                        [](const BatchEntry& entry) { return entry.trace != nullptr; });
  absl::Status status = StepLayers(batch, logits);
  if (traced_) routed_moe_->SetTraces({});
  // A failed step may leave the other micro-batch's layer in flight.
  if (!status.ok()) routed_moe_->Abandon();
  profile_.total = absl::Now() - start;
  if (status.ok() && ping_pong_ == PingPong::kMeasured && CanPingPong(batch)) {
    ping_pong_chooser_.Record(Rows(batch), profile_.ping_pong, profile_.total);
  }
  return status;
}

absl::Status ModelRunner::StepLayers(absl::Span<const BatchEntry> batch,
                                     std::vector<float>* logits) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  int64_t rows = 0;
  int64_t logit_rows = 0;
  for (const BatchEntry& entry : batch) {
    if (entry.state == nullptr || entry.tokens.empty()) {
      return absl::InvalidArgumentError("every batch entry needs a state and at least one token");
    }
    for (int32_t token : entry.tokens) {
      if (token < 0 || token >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", token, " outside the vocabulary [0, ", config.vocab_size, ")"));
      }
    }
    rows += static_cast<int64_t>(entry.tokens.size());
    logit_rows += entry.all_logits ? static_cast<int64_t>(entry.tokens.size()) : 1;
  }

  // Two micro-batches cut where their rows come closest to equal, or one.
  size_t cut = batch.size();
  if (CanPingPong(batch) &&
      (ping_pong_ == PingPong::kAlways || ping_pong_chooser_.Choose(rows))) {
    int64_t before = 0, best = rows + 1;
    for (size_t i = 1; i < batch.size(); ++i) {
      before += static_cast<int64_t>(batch[i - 1].tokens.size());
      if (std::abs(2 * before - rows) < best) {
        best = std::abs(2 * before - rows);
        cut = i;
      }
    }
  }
  const int count = cut < batch.size() ? 2 : 1;
  profile_.ping_pong = count == 2;
  micro_batches_[0].entries = batch.subspan(0, cut);
  micro_batches_[1].entries = batch.subspan(cut);
  for (int m = 0; m < count; ++m) Embed(micro_batches_[m]);

  const int layers = config.num_hidden_layers;
  if (count == 1) {
    MicroBatch& mb = micro_batches_[0];
    for (int l = 0; l < layers; ++l) {
      K3_RETURN_IF_ERROR(StartLayer(mb, l));
      K3_RETURN_IF_ERROR(FinishLayer(mb, l));
    }
  } else {
    // While one micro-batch's routed answer is in flight, the other's layer runs here:
    // start A0, start B0, finish A0, start A1, finish B0, start B1, ...
    for (MicroBatch& mb : micro_batches_) {
      K3_RETURN_IF_ERROR(StartLayer(mb, 0));
    }
    for (int l = 0; l < layers; ++l) {
      for (MicroBatch& mb : micro_batches_) {
        K3_RETURN_IF_ERROR(FinishLayer(mb, l));
        if (l + 1 == layers) continue;
        K3_RETURN_IF_ERROR(StartLayer(mb, l + 1));
      }
    }
  }
  for (const BatchEntry& entry : batch) entry.state->length += entry.tokens.size();

  // --- output: the rows whose logits are wanted, then one LM head product for all of them.
  selected_.resize(static_cast<size_t>(logit_rows * d));
  int64_t selected = 0;
  for (int m = 0; m < count; ++m) {
    selected += SelectOutputRows(micro_batches_[m], selected_.data() + selected * d);
  }
  logits->resize(static_cast<size_t>(logit_rows * config.vocab_size));
  MatMul(weights_->lm_head, selected_.data(), logit_rows, logits->data());
  return absl::OkStatus();
}

void ModelRunner::Embed(MicroBatch& mb) {
  const int64_t d = weights_->config.hidden_size;
  mb.rows = Rows(mb.entries);
  // The first source of depth attention, or the residual stream.
  mb.prefix.resize(static_cast<size_t>(mb.rows * d));
  int64_t r = 0;
  for (const BatchEntry& entry : mb.entries) {
    for (int32_t token : entry.tokens) {
      for (int64_t i = 0; i < d; ++i) mb.prefix[r * d + i] = weights_->embed_tokens.At(token, i);
      ++r;
    }
  }
  mb.hidden.resize(mb.prefix.size());
  mb.normed.resize(mb.prefix.size());
  mb.mixed.resize(mb.prefix.size());
  mb.ffn.resize(mb.prefix.size());
  mb.blocks.clear();
}

absl::Status ModelRunner::StartLayer(MicroBatch& mb, int layer) {
  const ModelConfig& config = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t d = config.hidden_size;
  const int64_t rows = mb.rows;
  const bool attn_res = config.HasAttnRes();
  // --- sequence-mixing sublayer
  bool prefix_empty = false;
  if (attn_res) {
    if (mb.blocks.empty()) {
      mb.hidden = mb.prefix;
    } else {
      DepthRead(mb, lw.attn_res_proj, lw.attn_res_norm, mb.hidden.data());
    }
    if (layer % *config.attn_res_block_size == 0) {
      mb.blocks.push_back(mb.prefix);
      prefix_empty = true;
    }
  }
  const std::vector<float>& mixer_input = attn_res ? mb.hidden : mb.prefix;
  RmsNormRows(mixer_input.data(), d, rows, d, lw.input_layernorm.data(), config.rms_norm_eps,
              mb.normed.data(), d);
  // Projections run once over every row of the micro-batch; the conv, the delta rule and the
  // attention run per sequence over its own state.
  absl::Status mixed;
  std::optional<ScopedStepPart> mixer_profile(std::in_place, StepPart::kMixers);
  if (lw.is_kda) {
    FillSegments(mb.entries, &SequenceState::kda, layer, &kda_segments_);
    mixed = KdaForwardBatch(config, lw.kda, mb.normed.data(), kda_segments_, mb.mixed.data(),
                            &mixer_scratch_);
  } else {
    FillSegments(mb.entries, &SequenceState::mla, layer, &mla_segments_);
    mixed = MlaForwardBatch(config, lw.mla, mb.normed.data(), mla_segments_, mb.mixed.data(),
                            &mixer_scratch_);
  }
  mixer_profile.reset();
  if (!mixed.ok()) return mixed;
  if (prefix_empty) {
    mb.prefix.swap(mb.mixed);
  } else {
    for (size_t i = 0; i < mb.prefix.size(); ++i) mb.prefix[i] += mb.mixed[i];
  }
  // --- FFN sublayer, up to the routed answer
  if (attn_res) DepthRead(mb, lw.mlp_res_proj, lw.mlp_res_norm, mb.hidden.data());
  const std::vector<float>& ffn_input = attn_res ? mb.hidden : mb.prefix;
  RmsNormRows(ffn_input.data(), d, rows, d, lw.post_attention_layernorm.data(),
              config.rms_norm_eps, mb.normed.data(), d);
  if (!lw.is_moe) {
    const GatedMlpWeights& mlp = lw.dense_mlp;
    GatedMlp(GatedMlpMatrices{mlp.gate, mlp.up, mlp.down}, glu_, mb.normed.data(), rows,
             mb.ffn.data(), false, &mlp_scratch_);
    return absl::OkStatus();
  }
  // The routed answer is in flight (possibly on other hosts) while the shared experts run here.
  if (traced_) {
    std::vector<TraceContext> traces;
    for (const BatchEntry& entry : mb.entries) {
      if (entry.trace != nullptr) traces.push_back(*entry.trace);
    }
    routed_moe_->SetTraces(std::move(traces));
  }
  const absl::Time begin = absl::Now();
  std::optional<ScopedStepPart> moe_profile(std::in_place, StepPart::kMoe);
  const absl::Status begun = routed_moe_->Begin(layer, mb.normed.data(), rows);
  moe_profile.reset();
  mb.moe_begin = absl::Now() - begin;
  if (!begun.ok()) {
    profile_.moe_wait += mb.moe_begin;
    return begun;
  }
  const GatedMlpWeights& shared = lw.moe.shared;
  GatedMlp(GatedMlpMatrices{shared.gate, shared.up, shared.down}, glu_, mb.normed.data(), rows,
           mb.ffn.data(), false, &mlp_scratch_);
  return absl::OkStatus();
}

absl::Status ModelRunner::FinishLayer(MicroBatch& mb, int layer) {
  const ModelConfig& config = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  if (lw.is_moe) {
    mb.routed.resize(static_cast<size_t>(mb.rows * config.ExpertWidth()));
    const absl::Time wait = absl::Now();
    std::optional<ScopedStepPart> moe_profile(std::in_place, StepPart::kMoe);
    const absl::Status answered = routed_moe_->Wait(mb.routed.data());
    moe_profile.reset();
    const absl::Duration waited = mb.moe_begin + (absl::Now() - wait);
    profile_.moe_wait += waited;
    profile_.layer_moe_wait.push_back(waited);
    if (!answered.ok()) return answered;
    if (config.IsLatentMoe()) {
      MatMul(lw.moe.latent_up, mb.routed.data(), config.ExpertWidth(), mb.rows, mb.ffn.data(),
             config.hidden_size, /*accumulate=*/true);
    } else {
      for (size_t i = 0; i < mb.ffn.size(); ++i) mb.ffn[i] += mb.routed[i];
    }
  }
  for (size_t i = 0; i < mb.prefix.size(); ++i) mb.prefix[i] += mb.ffn[i];
  return absl::OkStatus();
}

int64_t ModelRunner::SelectOutputRows(MicroBatch& mb, float* selected) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  if (config.HasAttnRes()) {
    DepthRead(mb, weights_->output_attn_res_proj, weights_->output_attn_res_norm,
              mb.hidden.data());
  } else {
    mb.hidden = mb.prefix;
  }
  int64_t r = 0, out_row = 0;
  for (const BatchEntry& entry : mb.entries) {
    const int64_t count = static_cast<int64_t>(entry.tokens.size());
    const int64_t first = entry.all_logits ? 0 : count - 1;
    for (int64_t t = first; t < count; ++t, ++out_row) {
      RmsNormRows(mb.hidden.data() + (r + t) * d, d, 1, d, weights_->final_norm.data(),
                  config.rms_norm_eps, selected + out_row * d, d);
    }
    r += count;
  }
  return out_row;
}

}  // namespace k3
