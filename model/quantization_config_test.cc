#include "model/quantization_config.h"

#include <string>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "model/config.h"

namespace k3 {
namespace {

// The release's quantization_config (spec §10), in compressed-tensors' config_groups layout.
constexpr char kRelease[] = R"json({
  "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
  "quantization_status": "compressed",
  "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
    "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                "symmetric": true, "scale_dtype": "torch.uint8"}}},
  "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
             "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]})json";

// k3-tiny's config.json (every required field) with `quantization` added inside text_config
// and, if given, `top_level` at the top level.
std::string WithQuantization(const std::string& quantization, const std::string& top_level = "") {
  nlohmann::json root = nlohmann::json::parse(ModelConfigToJson(*NamedConfig("k3-tiny")));
  if (!quantization.empty()) {
    root["text_config"]["quantization_config"] = nlohmann::json::parse(quantization);
  }
  if (!top_level.empty()) root["quantization_config"] = nlohmann::json::parse(top_level);
  return root.dump();
}

std::string Nested(const std::string& quantization) { return WithQuantization(quantization); }

TEST(QuantizationConfigTest, ReadsTheReleaseInsideTextConfig) {
  auto config = ParseModelConfig(Nested(kRelease));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->quantization.has_value());
  EXPECT_EQ(config->quantization->ignore.size(), 6u);
  EXPECT_EQ(config->quantization->ignore[2], R"(re:.*mlp\.(gate|up|gate_up|down)_proj.*)");
}

TEST(QuantizationConfigTest, ReadsTopLevelAndFlatWeightsLayout) {
  auto config = ParseModelConfig(
      WithQuantization("", R"({
          "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
          "weights": {"num_bits": 4, "group_size": 32}})"));
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->quantization.has_value());
  EXPECT_TRUE(config->quantization->ignore.empty());
  EXPECT_FALSE(ParseModelConfig(WithQuantization(""))
                   ->quantization.has_value());
}

TEST(QuantizationConfigTest, RoundTripsThroughModelConfigToJson) {
  auto config = ParseModelConfig(Nested(kRelease));
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string json = ModelConfigToJson(*config);
  // Written inside text_config, as the release has it.
  EXPECT_LT(json.find("\"text_config\""), json.find("\"quantization_config\""));
  auto again = ParseModelConfig(json);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
  EXPECT_EQ(*again, *config);
}

TEST(QuantizationConfigTest, RejectsOtherSchemesNamingThem) {
  struct Case {
    std::string quantization, message;
  };
  const std::string mx =
      R"("quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized")";
  const std::string w4 = R"("weights": {"num_bits": 4, "group_size": 32})";
  const Case cases[] = {
      {R"({"quant_method": "fp8", "format": "mxfp4-pack-quantized", )" + w4 + "}",
       "text_config.quantization_config.quant_method string \"fp8\" is not supported"},
      {R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", )" + w4 + "}",
       "format string \"nvfp4-pack-quantized\" is not supported"},
      {R"({"quant_method": "compressed-tensors", )" + w4 + "}", "format is missing"},
      {"{" + mx + R"(, "weights": {"num_bits": 8}})", "weights.num_bits 8 is not supported"},
      {"{" + mx + R"(, "weights": {"group_size": 16}})", "weights.group_size 16"},
      {"{" + mx + R"(, "weights": {"type": "int"}})", "weights.type string \"int\""},
      {"{" + mx + R"(, "config_groups": {"g": {"weights": {"num_bits": 4},
          "input_activations": {"num_bits": 8}}}})",
       "config_groups.g.input_activations"},
      {"{" + mx + "}", "weights: missing"},
      {"{" + mx + ", " + w4 + R"(, "ignore": ["re:(unclosed"]})", "ignore[0] \"re:(unclosed\""},
      {"{" + mx + ", " + w4 + R"(, "ignore": [3]})", "ignore[0] must be a string"},
      {"[1]", "quantization_config must be an object"},
  };
  for (const Case& c : cases) {
    auto config = ParseModelConfig(Nested(c.quantization));
    ASSERT_FALSE(config.ok()) << c.quantization;
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << config.status().message() << "\n  expected: " << c.message;
  }
}

TEST(QuantizationConfigTest, TwoDifferentConfigsAreRejected) {
  const std::string a = R"({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "weights": {"num_bits": 4}, "ignore": ["lm_head"]})";
  const std::string b = R"({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "weights": {"num_bits": 4}})";
  auto config = ParseModelConfig(WithQuantization(a, b));
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("differ"), std::string::npos);
}

TEST(QuantizationIgnoreListTest, ReleasePatternsKeepOnlyRoutedExpertsQuantized) {
  auto config = ParseModelConfig(Nested(kRelease));
  ASSERT_TRUE(config.ok()) << config.status();
  auto list = QuantizationIgnoreList::Create(config->quantization->ignore);
  ASSERT_TRUE(list.ok()) << list.status();
  for (const char* module :
       {"language_model.model.layers.3.self_attn.q_proj",
        "model.layers.1.block_sparse_moe.shared_experts.down_proj",
        "language_model.model.layers.0.mlp.gate_proj", "language_model.lm_head"}) {
    EXPECT_TRUE(list->Ignores(module)) << module;
  }
  for (const char* module : {"language_model.model.layers.1.block_sparse_moe.experts.0.w1",
                             "model.layers.92.block_sparse_moe.experts.895.w2",
                             "model.layers.1.block_sparse_moe.gate"}) {
    EXPECT_FALSE(list->Ignores(module)) << module;
  }
}

TEST(QuantizationIgnoreListTest, ExactNamesMatchWithOrWithoutPrefixAndRegexAnchorsAtStart) {
  auto list = QuantizationIgnoreList::Create({"lm_head", "re:model\\.layers\\.1\\."});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->Ignores("lm_head"));
  EXPECT_TRUE(list->Ignores("language_model.lm_head"));
  EXPECT_FALSE(list->Ignores("lm_head2"));
  EXPECT_TRUE(list->Ignores("model.layers.1.block_sparse_moe.experts.0.w1"));
  // re.match semantics: anchored at the start, so the prefixed name does not match.
  EXPECT_FALSE(list->Ignores("language_model.model.layers.1.block_sparse_moe.experts.0.w1"));
  EXPECT_FALSE(list->Ignores("model.layers.11.mlp.gate_proj"));
}

}  // namespace
}  // namespace k3
