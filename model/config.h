// ModelConfig: the text-model configuration of spec §1 (K3 and the Kimi Linear variant).
//
// A config.json either nests the text config under "text_config" (K3, model_type "kimi_k3") or is
// flat (Kimi Linear, model_type "kimi_linear").
//
// The fields that set the model's shapes are required (ParseModelConfig names every one missing):
// vocab_size, hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
// num_key_value_heads, q_lora_rank (null for a single q_proj), kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim, num_experts (null or 0: no MoE); with experts,
// num_experts_per_token, num_shared_experts and moe_intermediate_size; linear_attn_config in a K3
// config, and in any linear_attn_config its num_heads, head_dim and short_conv_kernel_size.
//
// Which defaults another missing field takes depends on the outer model type:
//
//  * "kimi_k3" (nested, or flat with that type): every field has the spec's K3 value below.
//  * "kimi_linear" (flat): the base fields still default to the K3 values, but a K3-only feature
//    that the file does not mention is off, as in a Kimi Linear release (spec §1.2, §12.5):
//    no attn_res_block_size (plain residual), no routed_expert_hidden_size (full-width experts),
//    latent_moe_use_norm false, mla_use_output_gate false, no gate_lower_bound (softplus gate),
//    use_full_rank_gate false (g_a/g_b low-rank gate), hidden_act "silu".
//
// Nullable fields (q_lora_rank, routed_expert_hidden_size, attn_res_block_size, gate_lower_bound,
// activation_situ_linear_beta) are unset by an explicit null; num_experts null means no MoE; a null
// token id is stored as -1. With hidden_act "silu" a missing activation_situ_linear_beta is unset.
// A null anywhere else is a type error.
//
// Layer lists (1-based, as in the file): when linear_attn_config gives only one of kda_layers and
// full_attn_layers, the other is its complement in 1..L; when it gives neither, K3's pattern is used
// (full attention at every 4th layer and at the last one). A flat config without any
// linear_attn_config has MLA in every layer (the HF code's is_kda is false without it).
//
// ParseModelConfig rejects unknown model types, wrong JSON types and inconsistent values (layer
// lists that do not cover 1..L exactly once, top-k above the expert count, unsupported router
// options, non-positive dims, ...) with InvalidArgument naming the field.
//
// Thread-safety: a ModelConfig is a plain value; share it freely once built.
#ifndef K3SERVE_MODEL_CONFIG_H_
#define K3SERVE_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/quantization_config.h"

namespace k3 {

enum class Activation { kSitu, kSilu };

struct LinearAttnConfig {
  int num_heads = 96;
  int head_dim = 128;
  int short_conv_kernel_size = 4;
  std::optional<float> gate_lower_bound = -5.0f;  // unset: Kimi Linear softplus gate (§5.3 B)
  bool use_full_rank_gate = true;                 // false: g_a_proj/g_b_proj low-rank output gate
  std::vector<int> kda_layers;                    // 1-based, as in the file
  std::vector<int> full_attn_layers;              // 1-based

  bool operator==(const LinearAttnConfig&) const = default;
};

struct ModelConfig {
  std::string model_type = "kimi_k3";  // outer type; "kimi_linear" for flat configs
  bool nested_text_config = true;      // whether the file nested the text config

  int64_t vocab_size = 163840;
  int hidden_size = 7168;
  int num_hidden_layers = 93;
  int intermediate_size = 33792;
  Activation hidden_act = Activation::kSitu;
  float activation_situ_beta = 4.0f;
  std::optional<float> activation_situ_linear_beta = 25.0f;
  float rms_norm_eps = 1e-5f;
  bool tie_word_embeddings = false;

  // MLA.
  int num_attention_heads = 96;
  int num_key_value_heads = 96;
  std::optional<int> q_lora_rank = 1536;  // unset: a single q_proj
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
  bool mla_use_nope = true;
  bool mla_use_output_gate = true;

  LinearAttnConfig linear_attn;

  // MoE.
  int num_experts = 896;  // 0: no MoE at all
  int num_experts_per_token = 16;
  int num_shared_experts = 2;
  int moe_intermediate_size = 3072;
  std::optional<int> routed_expert_hidden_size = 3584;  // set: LatentMoE
  bool latent_moe_use_norm = true;
  std::string moe_router_activation_func = "sigmoid";
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  bool use_grouped_topk = true;
  int num_expert_group = 1;
  int topk_group = 1;
  std::string topk_method = "noaux_tc";
  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;

  std::optional<int> attn_res_block_size = 12;  // unset: plain residual stream (Kimi Linear)
  int num_nextn_predict_layers = 0;
  int64_t bos_token_id = 163584;
  int64_t eos_token_id = 163586;
  int64_t pad_token_id = 163839;
  // quantization_config (spec §10), read from text_config or the top level; unset: no quantized
  // tensors. Written back inside text_config (or at the top level of a flat config).
  std::optional<QuantizationConfig> quantization;

  bool operator==(const ModelConfig&) const = default;

  // Layer predicates of spec §1.1; `layer` is 0-based.
  bool IsKda(int layer) const;
  bool IsMla(int layer) const { return !IsKda(layer); }
  bool IsMoe(int layer) const;
  bool HasAttnRes() const { return attn_res_block_size.has_value(); }
  bool IsLatentMoe() const { return routed_expert_hidden_size.has_value(); }

  // Derived sizes.
  int KdaWidth() const { return linear_attn.num_heads * linear_attn.head_dim; }
  int MlaQHeadDim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int MlaCacheWidth() const { return kv_lora_rank + qk_rope_head_dim; }
  // Width of the rows routed experts see: routed_expert_hidden_size, or hidden_size without LatentMoE.
  int ExpertWidth() const { return routed_expert_hidden_size.value_or(hidden_size); }
  int SharedWidth() const { return moe_intermediate_size * num_shared_experts; }
  int NumMoeLayers() const;
};

// Parses config.json text. Missing optional fields take the defaults above; see the file comment.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json);

// The checks ParseModelConfig applies, for configs built or edited in code.
absl::Status ValidateModelConfig(const ModelConfig& config);

// Reads and parses DIR/config.json (or the file itself when `path` is a file).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Writes the config back as JSON in the same layout (nested or flat) it was read from. Every field
// is written (unset optionals as null), so ParseModelConfig(ModelConfigToJson(c)) == c.
std::string ModelConfigToJson(const ModelConfig& config);

// The spec's named test configs: "k3-tiny", "k3-tiny-8", "kimi-linear-tiny", "k3-perf" (spec §12).
absl::StatusOr<ModelConfig> NamedConfig(std::string_view name);

}  // namespace k3

#endif  // K3SERVE_MODEL_CONFIG_H_
