// The spec's named test configurations (spec §12), kept apart from the parser so config.cc holds
// only parsing, validation and serialization.
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/config.h"

namespace k3 {
namespace {

// Spec §12 test configs, verbatim.
constexpr std::string_view kK3Tiny = R"json({
  "model_type": "kimi_k3",
  "text_config": {
    "model_type": "kimi_linear",
    "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 9,
    "intermediate_size": 512, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "mla_use_nope": true, "mla_use_output_gate": true,
    "linear_attn_config": {
      "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4,
      "gate_lower_bound": -5.0, "use_full_rank_gate": true,
      "kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8, 9]
    },
    "num_experts": 32, "num_experts_per_token": 4, "num_shared_experts": 2,
    "moe_intermediate_size": 64, "routed_expert_hidden_size": 128,
    "latent_moe_use_norm": true, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": true, "routed_scaling_factor": 1.0,
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1,
    "topk_method": "noaux_tc", "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "attn_res_block_size": 4, "num_nextn_predict_layers": 0
  }
})json";

constexpr std::string_view kKimiLinearTiny = R"json({
 "model_type": "kimi_linear",
 "vocab_size": 512,
 "hidden_size": 256,
 "num_hidden_layers": 6,
 "intermediate_size": 512,
 "hidden_act": "silu",
 "rms_norm_eps": 1e-05,
 "tie_word_embeddings": false,
 "num_attention_heads": 4,
 "num_key_value_heads": 4,
 "q_lora_rank": null,
 "kv_lora_rank": 64,
 "qk_nope_head_dim": 32,
 "qk_rope_head_dim": 16,
 "v_head_dim": 32,
 "mla_use_nope": true,
 "linear_attn_config": {
  "num_heads": 4,
  "head_dim": 32,
  "short_conv_kernel_size": 4,
  "kda_layers": [
   1,
   2,
   3,
   5
  ],
  "full_attn_layers": [
   4,
   6
  ]
 },
 "num_experts": 16,
 "num_experts_per_token": 4,
 "num_shared_experts": 1,
 "moe_intermediate_size": 64,
 "moe_router_activation_func": "sigmoid",
 "moe_renormalize": true,
 "routed_scaling_factor": 2.446,
 "use_grouped_topk": true,
 "num_expert_group": 1,
 "topk_group": 1,
 "first_k_dense_replace": 1,
 "moe_layer_freq": 1
})json";

constexpr std::string_view kK3Perf = R"json({
 "model_type": "kimi_k3",
 "text_config": {
  "model_type": "kimi_linear",
  "vocab_size": 4096,
  "hidden_size": 1024,
  "num_hidden_layers": 12,
  "intermediate_size": 2048,
  "hidden_act": "situ",
  "activation_situ_beta": 4.0,
  "activation_situ_linear_beta": 25.0,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false,
  "num_attention_heads": 8,
  "num_key_value_heads": 8,
  "q_lora_rank": 384,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "mla_use_nope": true,
  "mla_use_output_gate": true,
  "linear_attn_config": {
   "num_heads": 8,
   "head_dim": 128,
   "short_conv_kernel_size": 4,
   "gate_lower_bound": -5.0,
   "use_full_rank_gate": true,
   "kda_layers": [
    1,
    2,
    3,
    5,
    6,
    7,
    9,
    10,
    11
   ],
   "full_attn_layers": [
    4,
    8,
    12
   ]
  },
  "num_experts": 64,
  "num_experts_per_token": 8,
  "num_shared_experts": 2,
  "moe_intermediate_size": 512,
  "routed_expert_hidden_size": 512,
  "latent_moe_use_norm": true,
  "moe_router_activation_func": "sigmoid",
  "moe_renormalize": true,
  "routed_scaling_factor": 1.0,
  "use_grouped_topk": true,
  "num_expert_group": 1,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "attn_res_block_size": 4,
  "num_nextn_predict_layers": 0
 }
})json";

// k3-slice (spec §12.7): every matrix at K3's real shape, 4 layers, 64 routed experts and a
// 32768-token vocabulary; the GPU step benchmark's model (bench/gpu_step_bench).
constexpr std::string_view kK3Slice = R"json({
 "model_type": "kimi_k3",
 "text_config": {
  "model_type": "kimi_linear",
  "vocab_size": 32768,
  "hidden_size": 7168,
  "num_hidden_layers": 4,
  "intermediate_size": 33792,
  "hidden_act": "situ",
  "activation_situ_beta": 4.0,
  "activation_situ_linear_beta": 25.0,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false,
  "num_attention_heads": 96,
  "num_key_value_heads": 96,
  "q_lora_rank": 1536,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "mla_use_nope": true,
  "mla_use_output_gate": true,
  "linear_attn_config": {
   "num_heads": 96,
   "head_dim": 128,
   "short_conv_kernel_size": 4,
   "gate_lower_bound": -5.0,
   "use_full_rank_gate": true,
   "kda_layers": [1, 2, 3],
   "full_attn_layers": [4]
  },
  "num_experts": 64,
  "num_experts_per_token": 16,
  "num_shared_experts": 2,
  "moe_intermediate_size": 3072,
  "routed_expert_hidden_size": 3584,
  "latent_moe_use_norm": true,
  "moe_router_activation_func": "sigmoid",
  "moe_renormalize": true,
  "routed_scaling_factor": 1.0,
  "use_grouped_topk": true,
  "num_expert_group": 1,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "attn_res_block_size": 2,
  "num_nextn_predict_layers": 0
 }
})json";

}  // namespace

absl::StatusOr<ModelConfig> NamedConfig(std::string_view name) {
  if (name == "k3-tiny") return ParseModelConfig(kK3Tiny);
  if (name == "k3-perf") return ParseModelConfig(kK3Perf);
  if (name == "k3-slice") return ParseModelConfig(kK3Slice);
  if (name == "kimi-linear-tiny") return ParseModelConfig(kKimiLinearTiny);
  if (name == "k3-tiny-8") {
    K3_ASSIGN_OR_RETURN(auto config, ParseModelConfig(kK3Tiny));
    config.num_hidden_layers = 8;
    config.linear_attn.full_attn_layers = {4, 8};
    if (auto s = ValidateModelConfig(config); !s.ok()) return s;
    return config;
  }
  return absl::NotFoundError(absl::StrCat("no named config \"", Sv(name),
                                          "\" (known: k3-tiny, k3-tiny-8, kimi-linear-tiny, "
                                          "k3-perf, k3-slice)"));
}

}  // namespace k3
