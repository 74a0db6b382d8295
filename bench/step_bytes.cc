#include "bench/step_bytes.h"

#include "model/random_checkpoint.h"

namespace k3 {

int64_t NonExpertParameters(const ModelConfig& config) {
  // The checkpoint layout is the one list of every tensor of a config (spec §2).
  int64_t total = 0;
  for (const TensorSlot& slot : CheckpointLayout(config)) {
    if (slot.expert < 0) total += slot.numel();
  }
  return total;
}

int64_t Mxfp4ExpertBytes(const ModelConfig& config) {
  const int64_t values =
      3 * static_cast<int64_t>(config.moe_intermediate_size) * config.ExpertWidth();
  return values / 2 + values / 32;
}

DecodeStepBytes DecodeStepBytesFor(const ModelConfig& config, int batch, double context,
                                   double experts_touched) {
  const double d = config.hidden_size;
  int kda_layers = 0;
  for (int l = 0; l < config.num_hidden_layers; ++l) kda_layers += config.IsKda(l) ? 1 : 0;
  const int mla_layers = config.num_hidden_layers - kda_layers;
  const double heads = config.linear_attn.num_heads, head_dim = config.linear_attn.head_dim;
  const double kda_width = config.KdaWidth();
  const double window = config.linear_attn.short_conv_kernel_size - 1;
  const double state_bytes = 4.0 * (heads * head_dim * head_dim + 3 * window * kda_width);

  DecodeStepBytes bytes;
  const double embedding = static_cast<double>(config.vocab_size) * d;
  bytes.weights =
      2.0 * (static_cast<double>(NonExpertParameters(config)) - embedding) + 2.0 * d * batch;
  bytes.experts = experts_touched * static_cast<double>(Mxfp4ExpertBytes(config));
  bytes.kda_state = 2.0 * state_bytes * kda_layers * batch;
  bytes.mla_cache = 2.0 * config.MlaCacheWidth() * context * mla_layers * batch;
  return bytes;
}

}  // namespace k3
