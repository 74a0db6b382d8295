#include "model/config.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// Spec §12.1, copied from the spec (not from config.cc) so the two copies check each other.
constexpr char kK3TinyJson[] = R"json({
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

std::string Replace(std::string_view text, std::string_view from, std::string_view to) {
  std::string s(text);
  size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(ConfigTest, K3TinyMatchesSpec) {
  auto parsed = ParseModelConfig(kK3TinyJson);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig& c = *parsed;
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.model_type, "kimi_k3");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 9);
  EXPECT_EQ(c.hidden_act, Activation::kSitu);
  EXPECT_EQ(c.activation_situ_linear_beta, 25.0f);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.linear_attn.gate_lower_bound, -5.0f);
  EXPECT_TRUE(c.linear_attn.use_full_rank_gate);
  EXPECT_TRUE(c.HasAttnRes());
  EXPECT_EQ(c.attn_res_block_size, 4);
  EXPECT_TRUE(c.IsLatentMoe());
  // Spec §12.1 derived values.
  EXPECT_EQ(c.MlaQHeadDim(), 48);
  EXPECT_EQ(c.MlaCacheWidth(), 80);
  EXPECT_EQ(c.KdaWidth(), 128);
  EXPECT_EQ(c.SharedWidth(), 128);
  EXPECT_EQ(c.ExpertWidth(), 128);
  // 0-based: MLA at 3, 7, 8; MoE on 1..8.
  for (int l = 0; l < 9; ++l) {
    EXPECT_EQ(c.IsKda(l), l != 3 && l != 7 && l != 8) << l;
    EXPECT_EQ(c.IsMla(l), !c.IsKda(l));
    EXPECT_EQ(c.IsMoe(l), l >= 1) << l;
  }
  EXPECT_EQ(c.NumMoeLayers(), 8);
  auto named = NamedConfig("k3-tiny");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(*named, c);
}

TEST(ConfigTest, K3Tiny8) {
  auto c = NamedConfig("k3-tiny-8");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, 8);
  EXPECT_EQ(c->linear_attn.full_attn_layers, (std::vector<int>{4, 8}));
  EXPECT_EQ(c->linear_attn.kda_layers, (std::vector<int>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(c->NumMoeLayers(), 7);
}

TEST(ConfigTest, UnknownNamedConfigListsTheKnownOnes) {
  const absl::Status status = NamedConfig("k3-huge").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  for (const char* known :
       {"\"k3-huge\"", "k3-tiny-8", "k3-tiny", "kimi-linear-tiny", "k3-perf", "k3-slice"}) {
    EXPECT_NE(status.message().find(known), absl::string_view::npos) << known << ": " << status;
  }
}

TEST(ConfigTest, KimiLinearTinyHasNoK3Features) {
  auto parsed = NamedConfig("kimi-linear-tiny");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig& c = *parsed;
  EXPECT_FALSE(c.nested_text_config);
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.hidden_act, Activation::kSilu);
  EXPECT_FALSE(c.activation_situ_linear_beta.has_value());
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_FALSE(c.mla_use_output_gate);
  EXPECT_FALSE(c.linear_attn.gate_lower_bound.has_value());
  EXPECT_FALSE(c.linear_attn.use_full_rank_gate);
  EXPECT_FALSE(c.IsLatentMoe());
  EXPECT_FALSE(c.latent_moe_use_norm);
  EXPECT_FALSE(c.HasAttnRes());
  EXPECT_EQ(c.ExpertWidth(), 256);
  EXPECT_EQ(c.SharedWidth(), 64);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c.IsKda(l), l != 3 && l != 5) << l;
  EXPECT_EQ(c.NumMoeLayers(), 5);
}

TEST(ConfigTest, K3Perf) {
  auto c = NamedConfig("k3-perf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->num_experts, 64);
  EXPECT_EQ(c->num_experts_per_token, 8);
  EXPECT_EQ(c->q_lora_rank, 384);
  EXPECT_EQ(c->linear_attn.full_attn_layers, (std::vector<int>{4, 8, 12}));
  EXPECT_EQ(c->NumMoeLayers(), 11);
}

TEST(ConfigTest, UnknownNamedConfig) {
  auto c = NamedConfig("k3-huge");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("k3-huge"), std::string::npos);
}

// The required fields (the shapes), at K3's values.
constexpr char kK3RequiredFields[] = R"json(
    "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 93,
    "intermediate_size": 33792, "num_attention_heads": 96, "num_key_value_heads": 96,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2,
    "moe_intermediate_size": 3072,
    "linear_attn_config": {"num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4})json";

// A flat Kimi Linear config of the kimi-linear-tiny shapes with `fields` (num_hidden_layers among
// them) added.
std::string FlatConfig(const std::string& fields) {
  return absl::StrCat(R"json({"model_type": "kimi_linear", "vocab_size": 512, "hidden_size": 256,
      "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
      "q_lora_rank": null, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
      "v_head_dim": 32, "num_experts": null, )json",
                      fields, "}");
}

TEST(ConfigTest, MissingRequiredFieldsAreAllNamed) {
  std::string text = Replace(kK3TinyJson, "\"vocab_size\": 512, ", "");
  text = Replace(text, "\"moe_intermediate_size\": 64, ", "");
  auto c = ParseModelConfig(text);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "config: missing required fields: text_config.vocab_size, "
            "text_config.moe_intermediate_size");

  c = ParseModelConfig(Replace(kK3TinyJson, "\"num_heads\": 4, \"head_dim\": 32, ", ""));
  EXPECT_EQ(c.status().message(),
            "config: missing required fields: text_config.linear_attn_config.num_heads, "
            "text_config.linear_attn_config.head_dim");

  // A K3 config needs its linear attention; a flat Kimi Linear one without it is all MLA.
  const size_t la_begin = std::string_view(kK3TinyJson).find("\"linear_attn_config\"");
  const size_t la_end = std::string_view(kK3TinyJson).find("},", la_begin) + 2;
  text = std::string(kK3TinyJson).erase(la_begin, la_end - la_begin);
  c = ParseModelConfig(text);
  EXPECT_EQ(c.status().message(),
            "config: missing required field: text_config.linear_attn_config");

  // Without experts the MoE shapes are not needed.
  EXPECT_TRUE(ParseModelConfig(FlatConfig(R"("num_hidden_layers": 2)")).ok());
  c = ParseModelConfig(R"({"model_type": "kimi_k3", "text_config": {}})");
  ASSERT_FALSE(c.ok());
  for (const char* field : {"vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
                            "num_attention_heads", "num_key_value_heads", "q_lora_rank",
                            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                            "num_experts", "linear_attn_config"}) {
    EXPECT_NE(c.status().message().find(absl::StrCat("text_config.", field)), std::string::npos)
        << field << " in: " << c.status().message();
  }
}

// A K3 text config with only the required fields takes the spec §1.1 table's values for the rest.
TEST(ConfigTest, K3DefaultsAreTheSpecTable) {
  auto c = ParseModelConfig(
      absl::StrCat(R"({"model_type": "kimi_k3", "text_config": {)", kK3RequiredFields, "}}"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 163840);
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->num_hidden_layers, 93);
  EXPECT_EQ(c->intermediate_size, 33792);
  EXPECT_EQ(c->q_lora_rank, 1536);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->num_experts, 896);
  EXPECT_EQ(c->num_experts_per_token, 16);
  EXPECT_EQ(c->routed_expert_hidden_size, 3584);
  EXPECT_EQ(c->attn_res_block_size, 12);
  EXPECT_EQ(c->linear_attn.gate_lower_bound, -5.0f);
  EXPECT_EQ(c->SharedWidth(), 6144);
  EXPECT_EQ(c->KdaWidth(), 12288);
  EXPECT_EQ(c->MlaCacheWidth(), 576);
  EXPECT_EQ(c->linear_attn.kda_layers.size(), 69u);
  std::vector<int> full;
  for (int l = 4; l <= 92; l += 4) full.push_back(l);
  full.push_back(93);
  EXPECT_EQ(c->linear_attn.full_attn_layers, full);
  EXPECT_EQ(c->NumMoeLayers(), 92);
  EXPECT_EQ(c->bos_token_id, 163584);
}

TEST(ConfigTest, RoundTripsThroughJson) {
  for (const char* name : {"k3-tiny", "k3-tiny-8", "kimi-linear-tiny", "k3-perf", "k3-slice"}) {
    auto c = NamedConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    std::string text = ModelConfigToJson(*c);
    auto back = ParseModelConfig(text);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status() << "\n" << text;
    EXPECT_EQ(*back, *c) << name << "\n" << text;
    EXPECT_EQ(text.find("text_config") != std::string::npos, c->nested_text_config) << name;
  }
  // Odd values that only survive an exact float and null round trip.
  auto c = NamedConfig("k3-tiny");
  ASSERT_TRUE(c.ok());
  c->rms_norm_eps = 1.2345678e-6f;
  c->routed_scaling_factor = 2.446f;
  c->q_lora_rank.reset();
  c->activation_situ_linear_beta.reset();
  c->pad_token_id = -1;
  auto back = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

TEST(ConfigTest, Nulls) {
  std::string text = Replace(kK3TinyJson, "\"q_lora_rank\": 64", "\"q_lora_rank\": null");
  text = Replace(text, "\"attn_res_block_size\": 4", "\"attn_res_block_size\": null");
  text = Replace(text, "\"routed_expert_hidden_size\": 128", "\"routed_expert_hidden_size\": null");
  text = Replace(text, "\"gate_lower_bound\": -5.0", "\"gate_lower_bound\": null");
  auto c = ParseModelConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_FALSE(c->HasAttnRes());
  EXPECT_FALSE(c->IsLatentMoe());
  EXPECT_FALSE(c->linear_attn.gate_lower_bound.has_value());

  auto no_moe = ParseModelConfig(Replace(kK3TinyJson, "\"num_experts\": 32", "\"num_experts\": null"));
  ASSERT_TRUE(no_moe.ok()) << no_moe.status();
  EXPECT_EQ(no_moe->num_experts, 0);
  EXPECT_EQ(no_moe->NumMoeLayers(), 0);
}

TEST(ConfigTest, K3OnlyFieldsAbsentMeanK3ValuesWhenNested) {
  std::string text = Replace(kK3TinyJson, "\"attn_res_block_size\": 4, ", "");
  text = Replace(text, "\"gate_lower_bound\": -5.0, \"use_full_rank_gate\": true,", "");
  text = Replace(text, "\"mla_use_nope\": true, \"mla_use_output_gate\": true,", "");
  auto c = ParseModelConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_res_block_size, 12);
  EXPECT_EQ(c->linear_attn.gate_lower_bound, -5.0f);
  EXPECT_TRUE(c->linear_attn.use_full_rank_gate);
  EXPECT_TRUE(c->mla_use_output_gate);
}

TEST(ConfigTest, FlatKimiLinearHonorsExplicitK3Fields) {
  auto c = ParseModelConfig(FlatConfig(R"("num_hidden_layers": 4,
      "attn_res_block_size": 2, "hidden_act": "situ", "activation_situ_linear_beta": 25.0,
      "linear_attn_config": {"num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4,
                             "kda_layers": [1, 2, 3], "gate_lower_bound": -5.0})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_res_block_size, 2);
  EXPECT_EQ(c->hidden_act, Activation::kSitu);
  EXPECT_EQ(c->activation_situ_linear_beta, 25.0f);
  EXPECT_EQ(c->linear_attn.gate_lower_bound, -5.0f);
  EXPECT_FALSE(c->linear_attn.use_full_rank_gate);
  // Only kda_layers given: full attention is the complement.
  EXPECT_EQ(c->linear_attn.full_attn_layers, (std::vector<int>{4}));
}

TEST(ConfigTest, FlatWithoutLinearAttnIsAllMla) {
  auto c = ParseModelConfig(FlatConfig(R"("num_hidden_layers": 3)"));
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(c->IsMla(l));
  EXPECT_EQ(c->linear_attn.full_attn_layers, (std::vector<int>{1, 2, 3}));
}

TEST(ConfigTest, SiluWithoutLinearBetaInK3) {
  auto c = ParseModelConfig(
      Replace(Replace(kK3TinyJson, "\"hidden_act\": \"situ\"", "\"hidden_act\": \"silu\""),
              "\"activation_situ_linear_beta\": 25.0", "\"unused\": 0"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_act, Activation::kSilu);
  EXPECT_FALSE(c->activation_situ_linear_beta.has_value());
}

struct BadCase {
  const char* from;
  const char* to;
  const char* message;  // expected part of the error
};

TEST(ConfigTest, BadValuesNameTheField) {
  const BadCase cases[] = {
      {"\"hidden_size\": 256", "\"hidden_size\": \"256\"",
       "text_config.hidden_size must be an integer, got string"},
      {"\"hidden_size\": 256", "\"hidden_size\": 256.5", "text_config.hidden_size must be an integer"},
      {"\"hidden_size\": 256", "\"hidden_size\": -1", "hidden_size must be positive"},
      {"\"hidden_size\": 256", "\"hidden_size\": 1e20", "text_config.hidden_size"},
      {"\"hidden_size\": 256", "\"hidden_size\": null", "hidden_size must be an integer, got null"},
      {"\"num_hidden_layers\": 9", "\"num_hidden_layers\": 1000000000", "num_hidden_layers"},
      {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": 0", "rms_norm_eps must be positive"},
      {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": 1e300", "rms_norm_eps must be a finite float"},
      {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": \"no\"",
       "tie_word_embeddings must be true or false"},
      {"[1, 2, 3, 5, 6, 7]", "\"1,2,3\"", "kda_layers must be a list"},
      {"[1, 2, 3, 5, 6, 7]", "[1, 2, 3, 5, 6, 7, 10]", "kda_layers: layer 10 is out of range"},
      {"[1, 2, 3, 5, 6, 7]", "[0, 1, 2, 3, 5, 6, 7]", "kda_layers: layer 0 is out of range"},
      {"[1, 2, 3, 5, 6, 7]", "[1, 2, 3, 4, 5, 6, 7]", "layer 4 is listed twice"},
      {"[1, 2, 3, 5, 6, 7]", "[1, 2, 2, 3, 5, 6, 7]", "layer 2 is listed twice"},
      {"[1, 2, 3, 5, 6, 7]", "[1, 2, 3, 5, 6]", "layer 7 is in neither"},
      {"[1, 2, 3, 5, 6, 7]", "[1, 2.5, 3]", "kda_layers[1] must be an integer"},
      {"\"num_experts_per_token\": 4", "\"num_experts_per_token\": 33", "num_experts_per_token"},
      {"\"num_experts_per_token\": 4", "\"num_experts_per_token\": 0", "num_experts_per_token"},
      {"\"sigmoid\"", "\"softmax\"", "moe_router_activation_func \"softmax\" is not supported"},
      {"\"num_expert_group\": 1", "\"num_expert_group\": 8", "num_expert_group 8"},
      {"\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"greedy\"", "topk_method"},
      {"\"hidden_act\": \"situ\"", "\"hidden_act\": \"gelu\"", "hidden_act \"gelu\" is not supported"},
      {"\"mla_use_nope\": true", "\"mla_use_nope\": false", "mla_use_nope"},
      {"\"gate_lower_bound\": -5.0", "\"gate_lower_bound\": 1.0", "gate_lower_bound must be negative"},
      {"\"attn_res_block_size\": 4", "\"attn_res_block_size\": 0", "attn_res_block_size"},
      {"\"model_type\": \"kimi_k3\"", "\"model_type\": \"llama\"", "model_type \"llama\""},
      {"\"model_type\": \"kimi_linear\"", "\"model_type\": \"deepseek_v3\"",
       "text_config.model_type \"deepseek_v3\""},
      {"\"linear_attn_config\": {", "\"linear_attn_config\": 5, \"x\": {",
       "linear_attn_config must be an object"},
      {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 0", "moe_layer_freq must be positive"},
      {"\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\" 0", "invalid JSON"},
  };
  for (const BadCase& bad : cases) {
    std::string text = Replace(kK3TinyJson, bad.from, bad.to);
    auto c = ParseModelConfig(text);
    ASSERT_FALSE(c.ok()) << bad.to;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad.to;
    EXPECT_NE(c.status().message().find(bad.message), std::string::npos)
        << "expected \"" << bad.message << "\" in: " << c.status().message();
  }
}

TEST(ConfigTest, NotAnObject) {
  for (const char* text : {"", "[1, 2]", "42", "{", "{\"a\": }", "\"text\"", "null"}) {
    auto c = ParseModelConfig(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(ConfigTest, ValidateCatchesEditsInCode) {
  auto c = NamedConfig("k3-tiny");
  ASSERT_TRUE(c.ok());
  c->num_experts_per_token = 64;
  EXPECT_FALSE(ValidateModelConfig(*c).ok());
}

TEST(ConfigTest, LoadFromDirectoryAndFile) {
  std::string dir = ::testing::TempDir() + "/config_test_dir";
  ASSERT_EQ(::system(("mkdir -p " + dir).c_str()), 0);
  {
    std::ofstream out(dir + "/config.json");
    out << kK3TinyJson;
  }
  auto from_dir = LoadModelConfig(dir);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  auto from_file = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_dir, *from_file);
  EXPECT_EQ(from_dir->num_hidden_layers, 9);

  auto missing = LoadModelConfig(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  {
    std::ofstream out(dir + "/config.json");
    out << Replace(kK3TinyJson, "\"hidden_size\": 256", "\"hidden_size\": true");
  }
  auto bad = LoadModelConfig(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(dir + "/config.json"), std::string::npos);
  EXPECT_NE(bad.status().message().find("hidden_size"), std::string::npos);
}

}  // namespace
}  // namespace k3
