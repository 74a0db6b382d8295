// MoE layer numbering. The data plane (moe/moe_wire.h) names layers by their MODEL index (0-based
// decoder layer), the control plane (ExpertPlacement, LoadStats, LoadExperts) by their index among
// the MoE layers only. These convert between the two for any first_k_dense_replace and
// moe_layer_freq (with moe_layer_freq 1, as in K3: moe index = model index - first_k_dense_replace).
#ifndef K3SERVE_MOE_MOE_LAYER_MAP_H_
#define K3SERVE_MOE_MOE_LAYER_MAP_H_

#include "absl/status/statusor.h"
#include "model/config.h"

namespace k3 {

// The MoE index of model layer `model_layer`. INVALID_ARGUMENT when the layer is out of range or
// has no routed experts.
absl::StatusOr<int> MoeLayerIndex(const ModelConfig& config, int model_layer);

// The model layer of MoE layer `moe_layer`. INVALID_ARGUMENT when out of [0, NumMoeLayers()).
absl::StatusOr<int> ModelLayerOfMoe(const ModelConfig& config, int moe_layer);

}  // namespace k3

#endif  // K3SERVE_MOE_MOE_LAYER_MAP_H_
