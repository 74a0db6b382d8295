#include "moe/moe_layer_map.h"

#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<int> MoeLayerIndex(const ModelConfig& config, int model_layer) {
  if (model_layer < 0 || model_layer >= config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", model_layer, " is outside [0, ",
                                                   config.num_hidden_layers, ")"));
  }
  if (!config.IsMoe(model_layer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", model_layer, " is not a MoE layer (first_k_dense_replace ",
                     config.first_k_dense_replace, ", moe_layer_freq ", config.moe_layer_freq,
                     ", num_experts ", config.num_experts, ")"));
  }
  int index = 0;
  for (int l = 0; l < model_layer; ++l) index += config.IsMoe(l) ? 1 : 0;
  return index;
}

absl::StatusOr<int> ModelLayerOfMoe(const ModelConfig& config, int moe_layer) {
  if (moe_layer >= 0) {
    int seen = 0;
    for (int l = 0; l < config.num_hidden_layers; ++l) {
      if (!config.IsMoe(l)) continue;
      if (seen == moe_layer) return l;
      ++seen;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("MoE layer ", moe_layer, " is outside [0, ",
                                                 config.NumMoeLayers(), ")"));
}

}  // namespace k3
