// ModelWeights: every tensor of spec §2, checked for presence, shape and dtype, as the kernels use
// them. Matrices are WeightMatrix views into the memory-mapped checkpoint where the file's dtype is
// used as is (BF16, F32); F16 matrices, and any the file stores at a misaligned offset, are widened
// once into owned F32 storage. Vectors (norms, biases, A_log, dt_bias, AttnRes queries, conv
// weights) are copied to fp32 from any of BF16/F16/F32. Conv weights may be [C,1,K] or [C,K];
// A_log follows spec §11.1 (flattened; values past H must be zero padding).
//
// Routed experts may be MXFP4 (spec §10): `<name>.weight_packed` U8 [out, in / 2] and
// `<name>.weight_scale` U8 or F8_E8M0 [out, in / 32] in place of `<name>.weight`. They become
// kMxfp4 WeightMatrix views of the mapping (never unpacked: an expert costs its packed bytes); the
// config must have a quantization_config whose ignore list does not cover the module, and every
// scale byte must be at most kMxfp4MaxScale (255 is NaN; errors name the tensor, row and group).
// Any other tensor stored packed is Unimplemented (the release packs only routed experts).
//
// A WeightSelection picks which parts a process loads, so that each tier maps only its share:
// attention workers load everything but the routed experts, routers the gate and latent
// projections, expert workers only the experts they host.
//
// Ownership: ModelWeights keeps the Checkpoint (and so the mappings) alive. Read-only after Load;
// thread-safe to share.
#ifndef K3SERVE_MODEL_WEIGHTS_H_
#define K3SERVE_MODEL_WEIGHTS_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/matmul.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace k3 {

struct GatedMlpWeights {  // gate_proj / up_proj [f, d], down_proj [d, f]; also w1/w3/w2 experts
  WeightMatrix gate;
  WeightMatrix up;
  WeightMatrix down;
};

struct KdaWeights {
  WeightMatrix q_proj, k_proj, v_proj;  // [P, d]
  std::vector<float> q_conv, k_conv, v_conv;  // [P, kernel], flattened from [P,1,K] or [P,K]
  WeightMatrix f_a_proj;                // [head_dim, d]
  WeightMatrix f_b_proj;                // [P, head_dim]
  std::vector<float> dt_bias;           // [P]
  std::vector<float> a_log;             // [H] (tail padding checked and dropped, spec §11.1)
  WeightMatrix b_proj;                  // [H, d]
  WeightMatrix g_proj;                  // [P, d] full-rank gate; empty when low-rank
  WeightMatrix g_a_proj, g_b_proj;      // low-rank gate; empty when full-rank
  std::vector<float> o_norm;            // [head_dim]
  WeightMatrix o_proj;                  // [d, P]
};

struct MlaWeights {
  WeightMatrix q_a_proj;              // [q_lora, d]; empty when q_lora_rank is unset
  std::vector<float> q_a_layernorm;   // [q_lora]
  WeightMatrix q_b_proj;              // [H*192, q_lora]
  WeightMatrix q_proj;                // [H*192, d] when q_lora_rank is unset
  WeightMatrix kv_a_proj_with_mqa;    // [c + r, d]
  std::vector<float> kv_a_layernorm;  // [c]
  WeightMatrix kv_b_proj;             // [H*(n+v), c]
  WeightMatrix g_proj;                // [H*v, d]; empty without the output gate
  WeightMatrix o_proj;                // [d, H*v]
};

// The router's share of a MoE layer.
struct RouterWeights {
  WeightMatrix gate;                      // [E, d]
  std::vector<float> score_bias;          // e_score_correction_bias [E]
  WeightMatrix latent_down;               // routed_expert_down_proj [h, d]; empty without LatentMoE
  std::vector<float> latent_norm;         // routed_expert_norm [h]; empty without LatentMoE norm
};

struct MoeWeights {
  RouterWeights router;
  WeightMatrix latent_up;                 // routed_expert_up_proj [d, h]; empty without LatentMoE
  std::vector<GatedMlpWeights> experts;   // [E]; entries not selected are empty
  GatedMlpWeights shared;                 // width moe_intermediate_size * num_shared_experts
};

struct LayerWeights {
  std::vector<float> input_layernorm, post_attention_layernorm;
  // AttnRes (empty without it).
  std::vector<float> attn_res_norm, attn_res_proj;  // self_attention_res_{norm,proj}
  std::vector<float> mlp_res_norm, mlp_res_proj;
  bool is_kda = false;
  KdaWeights kda;
  MlaWeights mla;
  bool is_moe = false;
  GatedMlpWeights dense_mlp;  // layers < first_k_dense_replace
  MoeWeights moe;
};

struct WeightSelection {
  bool attention = true;        // embedding, norms, mixers, AttnRes, dense MLP, shared experts, LM head, latent up
  bool router = true;           // gate, score bias, latent down projection and norm
  bool all_experts = true;      // every routed expert
  std::vector<int> experts;     // otherwise these expert ids (in every MoE layer)

  static WeightSelection All() { return {}; }
  static WeightSelection AttentionOnly() { return {true, false, false, {}}; }
  static WeightSelection RouterOnly() { return {false, true, false, {}}; }
  static WeightSelection Experts(std::vector<int> ids) { return {false, false, false, std::move(ids)}; }
};

struct ModelWeights {
  ModelConfig config;
  WeightMatrix embed_tokens;  // [V, d]
  std::vector<float> final_norm;
  std::vector<float> output_attn_res_norm, output_attn_res_proj;  // empty without AttnRes
  WeightMatrix lm_head;       // [V, d]
  std::vector<LayerWeights> layers;

  std::shared_ptr<const Checkpoint> checkpoint;  // keeps the mappings alive
  std::deque<std::vector<float>> owned;          // widened F16 (or misaligned) matrices

  // Bytes of weights this selection maps or owns (for memory reports).
  size_t selected_bytes = 0;
};

// Loads and validates the selected tensors. `progress` (optional) is called with (done, total)
// tensor counts while loading. Errors name the tensor, its expected and found shape/dtype, and the file;
// DATA_LOSS names the first NaN or infinity of a tensor (every selected value is scanned).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    std::shared_ptr<const Checkpoint> checkpoint, const WeightSelection& selection,
    const std::function<void(size_t, size_t)>& progress = nullptr);

// The same from the checkpoint in `folder` (Checkpoint::Open's errors, then LoadWeights's); the
// weights keep the checkpoint open.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    const std::string& folder, const WeightSelection& selection,
    const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace k3

#endif  // K3SERVE_MODEL_WEIGHTS_H_
