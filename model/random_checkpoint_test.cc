#include "model/random_checkpoint.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "model/checkpoint.h"

namespace k3 {
namespace {

ModelConfig Named(const char* name) {
  auto c = NamedConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::map<std::string, std::vector<int64_t>> Shapes(const ModelConfig& config) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorSlot& slot : CheckpointLayout(config)) {
    EXPECT_TRUE(shapes.emplace(slot.name, slot.shape).second) << "repeated " << slot.name;
  }
  return shapes;
}

using Shape = std::vector<int64_t>;

// Spec §12.1 "Shapes for the tiny model", typed in from the spec.
TEST(CheckpointLayoutTest, K3TinyShapesMatchSpec) {
  auto shapes = Shapes(Named("k3-tiny"));
  const std::map<std::string, Shape> expected = {
      {"model.embed_tokens.weight", {512, 256}},
      {"lm_head.weight", {512, 256}},
      {"model.norm.weight", {256}},
      {"model.output_attn_res_norm.weight", {256}},
      {"model.output_attn_res_proj.weight", {1, 256}},
      {"model.layers.0.self_attention_res_proj.weight", {1, 256}},
      {"model.layers.0.mlp_res_norm.weight", {256}},
      // KDA (layer 0).
      {"model.layers.0.self_attn.q_proj.weight", {128, 256}},
      {"model.layers.0.self_attn.k_proj.weight", {128, 256}},
      {"model.layers.0.self_attn.v_proj.weight", {128, 256}},
      {"model.layers.0.self_attn.g_proj.weight", {128, 256}},
      {"model.layers.0.self_attn.q_conv1d.weight", {128, 1, 4}},
      {"model.layers.0.self_attn.f_a_proj.weight", {32, 256}},
      {"model.layers.0.self_attn.f_b_proj.weight", {128, 32}},
      {"model.layers.0.self_attn.dt_bias", {128}},
      {"model.layers.0.self_attn.A_log", {4}},
      {"model.layers.0.self_attn.b_proj.weight", {4, 256}},
      {"model.layers.0.self_attn.o_norm.weight", {32}},
      {"model.layers.0.self_attn.o_proj.weight", {256, 128}},
      // MLA (layer 3).
      {"model.layers.3.self_attn.q_a_proj.weight", {64, 256}},
      {"model.layers.3.self_attn.q_a_layernorm.weight", {64}},
      {"model.layers.3.self_attn.q_b_proj.weight", {192, 64}},
      {"model.layers.3.self_attn.kv_a_proj_with_mqa.weight", {80, 256}},
      {"model.layers.3.self_attn.kv_a_layernorm.weight", {64}},
      {"model.layers.3.self_attn.kv_b_proj.weight", {256, 64}},
      {"model.layers.3.self_attn.g_proj.weight", {128, 256}},
      {"model.layers.3.self_attn.o_proj.weight", {256, 128}},
      // Dense (layer 0).
      {"model.layers.0.mlp.gate_proj.weight", {512, 256}},
      {"model.layers.0.mlp.up_proj.weight", {512, 256}},
      {"model.layers.0.mlp.down_proj.weight", {256, 512}},
      // MoE (layer 8).
      {"model.layers.8.block_sparse_moe.gate.weight", {32, 256}},
      {"model.layers.8.block_sparse_moe.gate.e_score_correction_bias", {32}},
      {"model.layers.8.block_sparse_moe.routed_expert_down_proj.weight", {128, 256}},
      {"model.layers.8.block_sparse_moe.routed_expert_norm.weight", {128}},
      {"model.layers.8.block_sparse_moe.routed_expert_up_proj.weight", {256, 128}},
      {"model.layers.8.block_sparse_moe.experts.31.w1.weight", {64, 128}},
      {"model.layers.8.block_sparse_moe.experts.31.w3.weight", {64, 128}},
      {"model.layers.8.block_sparse_moe.experts.31.w2.weight", {128, 64}},
      {"model.layers.8.block_sparse_moe.shared_experts.gate_proj.weight", {128, 256}},
      {"model.layers.8.block_sparse_moe.shared_experts.up_proj.weight", {128, 256}},
      {"model.layers.8.block_sparse_moe.shared_experts.down_proj.weight", {256, 128}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_EQ(shapes.count(name), 1u) << name;
    EXPECT_EQ(shapes[name], shape) << name;
  }
  EXPECT_EQ(shapes.count("model.layers.0.block_sparse_moe.gate.weight"), 0u);  // dense layer 0
  EXPECT_EQ(shapes.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(shapes.count("model.layers.3.self_attn.A_log"), 0u);               // MLA layer
  EXPECT_EQ(shapes.count("model.layers.8.block_sparse_moe.experts.32.w1.weight"), 0u);
}

TEST(CheckpointLayoutTest, KimiLinearTinyShapes) {
  auto shapes = Shapes(Named("kimi-linear-tiny"));
  EXPECT_EQ(shapes["model.layers.0.self_attn.g_a_proj.weight"], (Shape{32, 256}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.g_b_proj.weight"], (Shape{128, 32}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.A_log"], (Shape{1, 1, 4, 1}));
  EXPECT_EQ(shapes["model.layers.3.self_attn.q_proj.weight"], (Shape{192, 256}));
  EXPECT_EQ(shapes["model.layers.1.block_sparse_moe.experts.15.w1.weight"], (Shape{64, 256}));
  EXPECT_EQ(shapes["model.layers.1.block_sparse_moe.experts.15.w2.weight"], (Shape{256, 64}));
  EXPECT_EQ(shapes["model.layers.1.block_sparse_moe.shared_experts.gate_proj.weight"],
            (Shape{64, 256}));
  for (const auto& [name, shape] : shapes) {
    EXPECT_EQ(name.find("_res_"), std::string::npos) << name;
    EXPECT_EQ(name.find("routed_expert"), std::string::npos) << name;
    EXPECT_EQ(name.find(".g_proj"), std::string::npos) << name;
    EXPECT_EQ(name.find("q_a_proj"), std::string::npos) << name;
  }
}

// Spec §12.6: "A 679M-parameter K3 (190M active per token: about 381 MB of BF16 weights read per
// decoded token)". Active = everything but the routed experts, plus k of them, minus the embedding
// table (a decoded token reads one row of it).
TEST(CheckpointLayoutTest, K3PerfParameterCounts) {
  const ModelConfig c = Named("k3-perf");
  int64_t total = 0, routed = 0, embedding = 0;
  for (const TensorSlot& slot : CheckpointLayout(c)) {
    total += slot.numel();
    if (slot.expert >= 0) routed += slot.numel();
    if (slot.name == "model.embed_tokens.weight") embedding = slot.numel();
  }
  EXPECT_GE(total, 678'500'000);
  EXPECT_LT(total, 679'500'000);
  const int64_t active = ActiveParameters(c);
  EXPECT_EQ(active, total - routed + routed / c.num_experts * c.num_experts_per_token - embedding);
  EXPECT_GE(active, 190'000'000);
  EXPECT_LT(active, 191'000'000);
  EXPECT_NEAR(active * 2 / 1e6, 381, 1);
}

struct Moments {
  double mean = 0, stddev = 0, kurtosis = 0, min = 1e30, max = -1e30;
};

Moments Measure(const std::vector<float>& v) {
  Moments m;
  for (float x : v) {
    m.mean += x;
    m.min = std::min(m.min, double{x});
    m.max = std::max(m.max, double{x});
  }
  m.mean /= v.size();
  double m2 = 0, m4 = 0;
  for (float x : v) {
    double d = x - m.mean;
    m2 += d * d;
    m4 += d * d * d * d;
  }
  m2 /= v.size();
  m4 /= v.size();
  m.stddev = std::sqrt(m2);
  m.kurtosis = m4 / (m2 * m2);
  return m;
}

TensorSlot Slot(const char* name, int64_t n, TensorInit init) { return {name, {n}, init}; }

// Spec §12.3 distributions, checked by moments of 1M draws.
TEST(RandomValuesTest, DistributionsFollowTheSpec) {
  constexpr int64_t kN = 1 << 20;
  const RandomCheckpointOptions options;
  struct Case {
    TensorInit init;
    double mean, stddev;
  };
  const Case normals[] = {{TensorInit::kLinear, 0, 0.02},   {TensorInit::kResProj, 0, 0.1},
                          {TensorInit::kNorm, 1, 0.1},      {TensorInit::kDtBias, 0, 0.5},
                          {TensorInit::kScoreBias, 0, 0.05}, {TensorInit::kEmbedding, 0, 1}};
  for (const Case& c : normals) {
    Moments m = Measure(RandomTensorValues(Slot("t", kN, c.init), 7, options));
    EXPECT_NEAR(m.mean, c.mean, 5 * c.stddev / std::sqrt(kN)) << static_cast<int>(c.init);
    EXPECT_NEAR(m.stddev / c.stddev, 1.0, 0.005) << static_cast<int>(c.init);
    EXPECT_NEAR(m.kurtosis, 3.0, 0.05) << static_cast<int>(c.init);
  }
  Moments conv = Measure(RandomTensorValues(Slot("c", kN, TensorInit::kConv), 7, options));
  EXPECT_GE(conv.min, -0.5);
  EXPECT_LT(conv.max, 0.5);
  EXPECT_NEAR(conv.stddev, std::sqrt(1.0 / 12), 0.002);
  EXPECT_NEAR(conv.mean, 0, 0.002);
  // A_log = log U(1, 16): exp(A_log) is uniform on [1, 16).
  std::vector<float> a_log = RandomTensorValues(Slot("a", kN, TensorInit::kALog), 7, options);
  for (float& x : a_log) x = std::exp(x);
  Moments a = Measure(a_log);
  EXPECT_GE(a.min, 1 - 1e-5);
  EXPECT_LT(a.max, 16 + 1e-4);
  EXPECT_NEAR(a.mean, 8.5, 0.02);
  EXPECT_NEAR(a.stddev, 15 / std::sqrt(12.0), 0.02);
}

// The normal CDF at a few points, against erf (the Box-Muller arithmetic is our own).
TEST(RandomValuesTest, NormalCdf) {
  constexpr int64_t kN = 1 << 22;
  std::vector<float> z = RandomTensorValues(Slot("z", kN, TensorInit::kEmbedding), 3, {});
  for (double x : {-3.0, -2.0, -1.0, -0.5, 0.0, 0.7, 1.5, 2.5}) {
    int64_t below = 0;
    for (float v : z) below += v < x ? 1 : 0;
    const double expected = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double sigma = std::sqrt(expected * (1 - expected) / kN);
    EXPECT_NEAR(static_cast<double>(below) / kN, expected, 5 * sigma + 1e-6) << x;
  }
}

TEST(RandomValuesTest, DeterministicPerNameAndSeed) {
  TensorSlot slot{"model.layers.0.self_attn.q_proj.weight", {300, 301}, TensorInit::kLinear};
  auto a = RandomTensorValues(slot, 5, {});
  EXPECT_EQ(a, RandomTensorValues(slot, 5, {}));
  EXPECT_NE(a, RandomTensorValues(slot, 6, {}));
  TensorSlot other = slot;
  other.name = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_NE(a, RandomTensorValues(other, 5, {}));
  // Odd sizes end with a half-used Box-Muller pair.
  for (float x : RandomTensorValues(Slot("odd", 65537, TensorInit::kNorm), 1, {})) {
    ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(RandomValuesTest, HotExpertRowsAreScaled) {
  TensorSlot gate{"model.layers.2.block_sparse_moe.gate.weight", {8, 16}, TensorInit::kLinear};
  RandomCheckpointOptions hot;
  hot.hot_experts = {1, 5};
  hot.hot_gate_scale = 10.0f;
  auto base = RandomTensorValues(gate, 9, {});
  auto scaled = RandomTensorValues(gate, 9, hot);
  for (int e = 0; e < 8; ++e) {
    for (int i = 0; i < 16; ++i) {
      const float factor = (e == 1 || e == 5) ? 10.0f : 1.0f;
      EXPECT_EQ(scaled[e * 16 + i], base[e * 16 + i] * factor) << e << "," << i;
    }
  }
  // Other tensors are untouched.
  TensorSlot up{"model.layers.2.block_sparse_moe.routed_expert_up_proj.weight", {8, 16},
                TensorInit::kLinear};
  EXPECT_EQ(RandomTensorValues(up, 9, {}), RandomTensorValues(up, 9, hot));
}

TEST(FloatToHalfTest, RoundTripsEveryHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(value))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(value), bits) << std::hex << bits;
  }
}

TEST(FloatToHalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);  // halfway, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway, odd rounds up
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);        // halfway to the smallest subnormal: even
  EXPECT_EQ(FloatToHalf(0x1p-25f * 1.5f), 0x0001);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the normals
}

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name;
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  return dir;
}

TEST(WriteRandomCheckpointTest, ShardedK3) {
  const ModelConfig config = Named("k3-tiny");
  const std::string dir = TempDir("random_sharded");
  RandomCheckpointOptions options;
  options.shards = 3;
  ASSERT_TRUE(WriteRandomCheckpoint(config, 11, dir, options).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config(), config);
  ASSERT_EQ((*ckpt)->files().size(), 3u);
  size_t stored = 0;
  for (const auto& file : (*ckpt)->files()) {
    EXPECT_FALSE(file->tensors().empty());
    stored += file->tensors().size();
    for (const auto& [name, info] : file->tensors()) {
      EXPECT_EQ(name.rfind("language_model.", 0), 0u) << name;
    }
  }
  const auto layout = CheckpointLayout(config);
  EXPECT_EQ(stored, layout.size());
  for (const TensorSlot& slot : layout) {
    auto view = (*ckpt)->Find(slot.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->shape, slot.shape);
    const bool f32 = slot.name.ends_with("dt_bias") || slot.name.ends_with("A_log") ||
                     slot.name.ends_with("e_score_correction_bias");
    EXPECT_EQ(view->dtype, f32 ? DType::kF32 : DType::kBf16) << slot.name;
    // The stored values are the generator's, rounded to the dtype.
    const std::vector<float> values = RandomTensorValues(slot, 11, options);
    for (int64_t i = 0; i < slot.numel(); i += 97) {
      if (f32) {
        float stored_value;
        std::memcpy(&stored_value, view->data + 4 * i, 4);
        ASSERT_EQ(stored_value, values[i]) << slot.name;
      } else {
        uint16_t bits;
        std::memcpy(&bits, view->data + 2 * i, 2);
        ASSERT_EQ(bits, FloatToBf16(values[i])) << slot.name;
      }
    }
  }
}

TEST(WriteRandomCheckpointTest, KimiLinearHasNoPrefix) {
  const std::string dir = TempDir("random_kimi");
  ASSERT_TRUE(WriteRandomCheckpoint(Named("kimi-linear-tiny"), 1, dir).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ((*ckpt)->files().size(), 1u);
  for (const auto& [name, info] : (*ckpt)->files()[0]->tensors()) {
    EXPECT_EQ(name.find("language_model."), std::string::npos) << name;
  }
  EXPECT_FALSE((*ckpt)->config().nested_text_config);
}

// Only the checkpoint: model/ knows nothing of tokenizers (tools/random_model_folder.h adds one).
TEST(WriteRandomCheckpointTest, WritesOnlyTheConfigAndTheWeights) {
  const std::string dir = TempDir("random_files");
  ASSERT_TRUE(WriteRandomCheckpoint(Named("k3-tiny"), 1, dir).ok());
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.insert(entry.path().filename().string());
  }
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"}));
}

TEST(WriteRandomCheckpointTest, RewritingSwitchesLayouts) {
  const ModelConfig config = Named("k3-tiny-8");
  const std::string dir = TempDir("random_relayout");
  ASSERT_TRUE(WriteRandomCheckpoint(config, 1, dir, 2).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(config, 1, dir, 1).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 1u);
}

TEST(WriteRandomCheckpointTest, BadOptions) {
  const ModelConfig config = Named("k3-tiny");
  const std::string dir = TempDir("random_bad");
  RandomCheckpointOptions options;
  options.shards = 0;
  EXPECT_FALSE(WriteRandomCheckpoint(config, 1, dir, options).ok());
  options.shards = 1'000'000;
  EXPECT_FALSE(WriteRandomCheckpoint(config, 1, dir, options).ok());
  options.shards = 1;
  options.dtype = DType::kI8;
  EXPECT_FALSE(WriteRandomCheckpoint(config, 1, dir, options).ok());
  options.dtype = DType::kBf16;
  options.hot_experts = {32};
  EXPECT_FALSE(WriteRandomCheckpoint(config, 1, dir, options).ok());
  ModelConfig invalid = config;
  invalid.num_experts_per_token = 100;
  EXPECT_FALSE(WriteRandomCheckpoint(invalid, 1, dir).ok());
}

}  // namespace
}  // namespace k3
