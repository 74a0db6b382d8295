#include "attention_nodes/model_runner.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "attention_nodes/attn_res.h"
#include "kernels/bf16.h"
#include "kernels/matmul.h"
#include "kernels/rms_norm.h"
#include "model/glu_params.h"

namespace k3 {

size_t SequenceState::ByteSize() const {
  size_t bytes = 0;
  for (const KdaState& s : kda) bytes += s.ByteSize();
  for (const MlaCache& c : mla) bytes += c.ByteSize();
  return bytes;
}

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

void ModelRunner::DepthRead(const std::vector<float>& proj, const std::vector<float>& norm,
                              int64_t rows, float* out) {
  sources_.clear();
  for (const std::vector<float>& block : blocks_) sources_.push_back(block.data());
  sources_.push_back(prefix_.data());
  AttnResRead(sources_, rows, weights_->config.hidden_size, proj.data(), norm.data(),
              weights_->config.rms_norm_eps, out);
}

absl::Status ModelRunner::FeedForward(int layer, int64_t rows, float* out) {
  const ModelConfig& config = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  if (!lw.is_moe) {
    const GatedMlpWeights& mlp = lw.dense_mlp;
    GatedMlp(GatedMlpMatrices{mlp.gate, mlp.up, mlp.down}, glu_, normed_.data(), rows, out, false,
             &mlp_scratch_);
    return absl::OkStatus();
  }
  // The routed answer is in flight (possibly on other hosts) while the shared experts run here.
  const absl::Time begin = absl::Now();
  const absl::Status begun = routed_moe_->Begin(layer, normed_.data(), rows);
  absl::Duration waited = absl::Now() - begin;
  if (!begun.ok()) {
    profile_.moe_wait += waited;
    return begun;
  }
  const GatedMlpWeights& shared = lw.moe.shared;
  GatedMlp(GatedMlpMatrices{shared.gate, shared.up, shared.down}, glu_, normed_.data(), rows, out,
           false, &mlp_scratch_);
  routed_.resize(static_cast<size_t>(rows * config.ExpertWidth()));
  const absl::Time wait = absl::Now();
  const absl::Status answered = routed_moe_->Wait(routed_.data());
  waited += absl::Now() - wait;
  profile_.moe_wait += waited;
  profile_.layer_moe_wait.push_back(waited);
  if (!answered.ok()) return answered;
  if (config.IsLatentMoe()) {
    MatMul(lw.moe.latent_up, routed_.data(), config.ExpertWidth(), rows, out, config.hidden_size,
           /*accumulate=*/true);
  } else {
    for (int64_t i = 0; i < rows * config.hidden_size; ++i) out[i] += routed_[i];
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) {
  const absl::Time start = absl::Now();
  profile_.moe_wait = absl::ZeroDuration();
  profile_.layer_moe_wait.clear();
  absl::Status status = StepLayers(batch, logits);
  profile_.total = absl::Now() - start;
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

  // Embedding: the first source of depth attention, or the residual stream.
  prefix_.resize(static_cast<size_t>(rows * d));
  {
    int64_t r = 0;
    for (const BatchEntry& entry : batch) {
      for (int32_t token : entry.tokens) {
        for (int64_t i = 0; i < d; ++i) prefix_[r * d + i] = weights_->embed_tokens.At(token, i);
        ++r;
      }
    }
  }
  hidden_.resize(prefix_.size());
  normed_.resize(prefix_.size());
  mixed_.resize(prefix_.size());
  ffn_.resize(prefix_.size());
  blocks_.clear();
  const bool attn_res = config.HasAttnRes();

  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const LayerWeights& lw = weights_->layers[l];
    // --- sequence-mixing sublayer
    bool prefix_empty = false;
    if (attn_res) {
      if (blocks_.empty()) {
        hidden_ = prefix_;
      } else {
        DepthRead(lw.attn_res_proj, lw.attn_res_norm, rows, hidden_.data());
      }
      if (l % *config.attn_res_block_size == 0) {
        blocks_.push_back(prefix_);
        prefix_empty = true;
      }
    }
    const std::vector<float>& mixer_input = attn_res ? hidden_ : prefix_;
    RmsNormRows(mixer_input.data(), d, rows, d, lw.input_layernorm.data(), config.rms_norm_eps,
                normed_.data(), d);
    // Projections run once over every row of the batch; the conv, the delta rule and the
    // attention run per sequence over its own state.
    absl::Status mixed;
    if (lw.is_kda) {
      kda_segments_.clear();
      for (const BatchEntry& entry : batch) {
        kda_segments_.push_back(KdaSegment{&entry.state->kda[l], static_cast<int64_t>(entry.tokens.size())});
      }
      mixed = KdaForwardBatch(config, lw.kda, normed_.data(), kda_segments_, mixed_.data(),
                              &mixer_scratch_);
    } else {
      mla_segments_.clear();
      for (const BatchEntry& entry : batch) {
        mla_segments_.push_back(MlaSegment{&entry.state->mla[l], static_cast<int64_t>(entry.tokens.size())});
      }
      mixed = MlaForwardBatch(config, lw.mla, normed_.data(), mla_segments_, mixed_.data(),
                              &mixer_scratch_);
    }
    if (!mixed.ok()) return mixed;
    if (prefix_empty) {
      prefix_.swap(mixed_);
    } else {
      for (size_t i = 0; i < prefix_.size(); ++i) prefix_[i] += mixed_[i];
    }
    // --- FFN sublayer
    if (attn_res) {
      DepthRead(lw.mlp_res_proj, lw.mlp_res_norm, rows, hidden_.data());
    }
    const std::vector<float>& ffn_input = attn_res ? hidden_ : prefix_;
    RmsNormRows(ffn_input.data(), d, rows, d, lw.post_attention_layernorm.data(),
                config.rms_norm_eps, normed_.data(), d);
    if (absl::Status s = FeedForward(l, rows, ffn_.data()); !s.ok()) return s;
    for (size_t i = 0; i < prefix_.size(); ++i) prefix_[i] += ffn_[i];
  }
  for (const BatchEntry& entry : batch) entry.state->length += entry.tokens.size();

  // --- output: the final depth read, then only the rows whose logits are wanted.
  if (attn_res) {
    DepthRead(weights_->output_attn_res_proj, weights_->output_attn_res_norm, rows,
                hidden_.data());
  } else {
    hidden_ = prefix_;
  }
  std::vector<float>& selected = normed_;
  {
    int64_t r = 0, out_row = 0;
    for (const BatchEntry& entry : batch) {
      const int64_t count = static_cast<int64_t>(entry.tokens.size());
      const int64_t first = entry.all_logits ? 0 : count - 1;
      for (int64_t t = first; t < count; ++t, ++out_row) {
        RmsNormRows(hidden_.data() + (r + t) * d, d, 1, d, weights_->final_norm.data(),
                    config.rms_norm_eps, selected.data() + out_row * d, d);
      }
      r += count;
    }
  }
  logits->resize(static_cast<size_t>(logit_rows * config.vocab_size));
  MatMul(weights_->lm_head, selected.data(), logit_rows, logits->data());
  return absl::OkStatus();
}

}  // namespace k3
