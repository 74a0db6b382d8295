#include "model/weights.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "model/random_checkpoint.h"

namespace k3 {
namespace {

constexpr uint64_t kSeed = 2024;

ModelConfig Named(const char* name) {
  auto c = NamedConfig(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::string Fresh(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name;
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  return dir;
}

std::string Write(const ModelConfig& config, const std::string& name,
                  const RandomCheckpointOptions& options = {}) {
  const std::string dir = Fresh(name);
  absl::Status status = WriteRandomCheckpoint(config, kSeed, dir, options);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

// A fresh copy of one k3-tiny-8 checkpoint written once per test binary (writing is the slow part).
std::string CopyOfTiny8(const std::string& name) {
  static const std::string* base = [] {
    auto* dir = new std::string(Fresh("weights_tiny8_base"));
    absl::Status status = WriteRandomCheckpoint(Named("k3-tiny-8"), kSeed, *dir, 1);
    EXPECT_TRUE(status.ok()) << status;
    return dir;
  }();
  const std::string dir = Fresh(name);
  std::filesystem::copy(*base, dir);
  return dir;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> Load(
    const std::string& dir, const WeightSelection& selection = WeightSelection::All(),
    const std::function<void(size_t, size_t)>& progress = nullptr) {
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  return LoadWeights(std::shared_ptr<const Checkpoint>(*std::move(ckpt)), selection, progress);
}

// Element i of a loaded matrix, read from its bytes (independent of the kernels' accessors).
float Element(const WeightMatrix& m, int64_t i) {
  if (m.type == WeightType::kF32) {
    float v;
    std::memcpy(&v, static_cast<const uint8_t*>(m.data) + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, static_cast<const uint8_t*>(m.data) + 2 * i, 2);
  return Bf16ToFloat(bits);
}

float Rounded(float value, DType dtype) {
  switch (dtype) {
    case DType::kBf16: return Bf16ToFloat(FloatToBf16(value));
    case DType::kF16: return HalfToFloat(FloatToHalf(value));
    default: return value;
  }
}

const TensorSlot& SlotNamed(const std::vector<TensorSlot>& layout, const std::string& name) {
  for (const TensorSlot& slot : layout) {
    if (slot.name == name) return slot;
  }
  ADD_FAILURE() << "no slot " << name;
  return layout.front();
}

// The loaded matrix holds the generator's values for `name`, rounded to the file's dtype.
void ExpectMatrix(const WeightMatrix& m, const std::vector<TensorSlot>& layout,
                  const std::string& name, DType dtype, const RandomCheckpointOptions& options = {}) {
  const TensorSlot& slot = SlotNamed(layout, name);
  ASSERT_FALSE(m.empty()) << name;
  ASSERT_EQ(m.rows, slot.shape[0]) << name;
  ASSERT_EQ(m.cols, slot.shape[1]) << name;
  const std::vector<float> values = RandomTensorValues(slot, kSeed, options);
  for (int64_t i = 0; i < slot.numel(); ++i) {
    ASSERT_EQ(Element(m, i), Rounded(values[i], dtype)) << name << " element " << i;
  }
}

void ExpectVector(const std::vector<float>& v, const std::vector<TensorSlot>& layout,
                  const std::string& name, DType dtype) {
  const TensorSlot& slot = SlotNamed(layout, name);
  const std::vector<float> values = RandomTensorValues(slot, kSeed, {});
  ASSERT_EQ(static_cast<int64_t>(v.size()), slot.numel()) << name;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], Rounded(values[i], dtype)) << name << " element " << i;
  }
}

TEST(WeightsTest, K3TinyLoadsEverything) {
  const ModelConfig config = Named("k3-tiny");
  const std::string dir = Write(config, "weights_k3_tiny");
  size_t calls = 0, last_done = 0, last_total = 0;
  auto w = Load(dir, WeightSelection::All(), [&](size_t done, size_t total) {
    ++calls;
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    last_total = total;
  });
  ASSERT_TRUE(w.ok()) << w.status();
  const auto layout = CheckpointLayout(config);
  EXPECT_EQ(calls, layout.size());
  EXPECT_EQ(last_total, layout.size());
  EXPECT_EQ(last_done, last_total);

  const ModelWeights& m = **w;
  EXPECT_EQ(m.config, config);
  EXPECT_EQ(m.embed_tokens.type, WeightType::kBf16);
  ExpectMatrix(m.embed_tokens, layout, "model.embed_tokens.weight", DType::kBf16);
  ExpectMatrix(m.lm_head, layout, "lm_head.weight", DType::kBf16);
  ExpectVector(m.final_norm, layout, "model.norm.weight", DType::kBf16);
  ExpectVector(m.output_attn_res_proj, layout, "model.output_attn_res_proj.weight", DType::kBf16);
  ASSERT_EQ(m.layers.size(), 9u);

  const LayerWeights& kda = m.layers[0];
  EXPECT_TRUE(kda.is_kda);
  EXPECT_FALSE(kda.is_moe);
  ExpectMatrix(kda.kda.q_proj, layout, "model.layers.0.self_attn.q_proj.weight", DType::kBf16);
  ExpectMatrix(kda.kda.g_proj, layout, "model.layers.0.self_attn.g_proj.weight", DType::kBf16);
  EXPECT_TRUE(kda.kda.g_a_proj.empty());
  ExpectVector(kda.kda.q_conv, layout, "model.layers.0.self_attn.q_conv1d.weight", DType::kBf16);
  ExpectVector(kda.kda.dt_bias, layout, "model.layers.0.self_attn.dt_bias", DType::kF32);
  ExpectVector(kda.kda.a_log, layout, "model.layers.0.self_attn.A_log", DType::kF32);
  ExpectVector(kda.kda.o_norm, layout, "model.layers.0.self_attn.o_norm.weight", DType::kBf16);
  ExpectVector(kda.attn_res_proj, layout, "model.layers.0.self_attention_res_proj.weight",
               DType::kBf16);
  ExpectMatrix(kda.dense_mlp.down, layout, "model.layers.0.mlp.down_proj.weight", DType::kBf16);
  EXPECT_TRUE(kda.moe.experts.empty());

  const LayerWeights& mla = m.layers[3];
  EXPECT_FALSE(mla.is_kda);
  EXPECT_TRUE(mla.is_moe);
  ExpectMatrix(mla.mla.q_b_proj, layout, "model.layers.3.self_attn.q_b_proj.weight", DType::kBf16);
  ExpectMatrix(mla.mla.g_proj, layout, "model.layers.3.self_attn.g_proj.weight", DType::kBf16);
  EXPECT_TRUE(mla.mla.q_proj.empty());
  ExpectVector(mla.mla.kv_a_layernorm, layout, "model.layers.3.self_attn.kv_a_layernorm.weight",
               DType::kBf16);
  EXPECT_TRUE(mla.dense_mlp.gate.empty());

  const MoeWeights& moe = m.layers[8].moe;
  ExpectMatrix(moe.router.gate, layout, "model.layers.8.block_sparse_moe.gate.weight", DType::kBf16);
  ExpectVector(moe.router.score_bias, layout,
               "model.layers.8.block_sparse_moe.gate.e_score_correction_bias", DType::kF32);
  ExpectMatrix(moe.router.latent_down, layout,
               "model.layers.8.block_sparse_moe.routed_expert_down_proj.weight", DType::kBf16);
  ExpectVector(moe.router.latent_norm, layout,
               "model.layers.8.block_sparse_moe.routed_expert_norm.weight", DType::kBf16);
  ExpectMatrix(moe.latent_up, layout, "model.layers.8.block_sparse_moe.routed_expert_up_proj.weight",
               DType::kBf16);
  ASSERT_EQ(moe.experts.size(), 32u);
  ExpectMatrix(moe.experts[31].gate, layout, "model.layers.8.block_sparse_moe.experts.31.w1.weight",
               DType::kBf16);
  ExpectMatrix(moe.experts[31].up, layout, "model.layers.8.block_sparse_moe.experts.31.w3.weight",
               DType::kBf16);
  ExpectMatrix(moe.experts[31].down, layout, "model.layers.8.block_sparse_moe.experts.31.w2.weight",
               DType::kBf16);
  ExpectMatrix(moe.shared.down, layout,
               "model.layers.8.block_sparse_moe.shared_experts.down_proj.weight", DType::kBf16);

  // Every matrix maps its file bytes; every vector is an fp32 copy.
  size_t expected_bytes = 0;
  for (const TensorSlot& slot : layout) {
    const bool matrix = slot.init == TensorInit::kLinear || slot.init == TensorInit::kEmbedding;
    expected_bytes += slot.numel() * (matrix ? 2 : 4);
  }
  EXPECT_EQ(m.selected_bytes, expected_bytes);
}

TEST(WeightsTest, KimiLinearTiny) {
  const ModelConfig config = Named("kimi-linear-tiny");
  const std::string dir = Write(config, "weights_kimi");
  auto w = Load(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const auto layout = CheckpointLayout(config);
  const ModelWeights& m = **w;
  EXPECT_TRUE(m.output_attn_res_proj.empty());
  const LayerWeights& kda = m.layers[0];
  EXPECT_TRUE(kda.attn_res_norm.empty());
  EXPECT_TRUE(kda.kda.g_proj.empty());
  ExpectMatrix(kda.kda.g_a_proj, layout, "model.layers.0.self_attn.g_a_proj.weight", DType::kBf16);
  ExpectMatrix(kda.kda.g_b_proj, layout, "model.layers.0.self_attn.g_b_proj.weight", DType::kBf16);
  // Stored [1, 1, H, 1], loaded as H values.
  ExpectVector(kda.kda.a_log, layout, "model.layers.0.self_attn.A_log", DType::kF32);
  const LayerWeights& mla = m.layers[3];
  EXPECT_TRUE(mla.mla.q_a_proj.empty());
  EXPECT_TRUE(mla.mla.g_proj.empty());
  ExpectMatrix(mla.mla.q_proj, layout, "model.layers.3.self_attn.q_proj.weight", DType::kBf16);
  const MoeWeights& moe = m.layers[1].moe;
  EXPECT_TRUE(moe.latent_up.empty());
  EXPECT_TRUE(moe.router.latent_down.empty());
  EXPECT_TRUE(moe.router.latent_norm.empty());
  ASSERT_EQ(moe.experts.size(), 16u);
  EXPECT_EQ(moe.experts[15].gate.cols, 256);  // full width
  ExpectMatrix(moe.experts[15].down, layout, "model.layers.1.block_sparse_moe.experts.15.w2.weight",
               DType::kBf16);
}

TEST(WeightsTest, K3Tiny8Loads) {
  auto w = Load(CopyOfTiny8("weights_k3_tiny_8"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layers.size(), 8u);
}

// Every weight of `a` equals the same weight of `b`, compared as floats.
void ExpectSameWeights(const ModelWeights& a, const ModelWeights& b) {
  auto same_matrix = [](const WeightMatrix& x, const WeightMatrix& y) {
    ASSERT_EQ(x.empty(), y.empty());
    if (x.empty()) return;
    ASSERT_EQ(x.rows, y.rows);
    ASSERT_EQ(x.cols, y.cols);
    for (int64_t i = 0; i < x.rows * x.cols; ++i) ASSERT_EQ(Element(x, i), Element(y, i)) << i;
  };
  auto same_mlp = [&](const GatedMlpWeights& x, const GatedMlpWeights& y) {
    same_matrix(x.gate, y.gate);
    same_matrix(x.up, y.up);
    same_matrix(x.down, y.down);
  };
  same_matrix(a.embed_tokens, b.embed_tokens);
  same_matrix(a.lm_head, b.lm_head);
  EXPECT_EQ(a.final_norm, b.final_norm);
  EXPECT_EQ(a.output_attn_res_proj, b.output_attn_res_proj);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights& x = a.layers[l];
    const LayerWeights& y = b.layers[l];
    EXPECT_EQ(x.input_layernorm, y.input_layernorm);
    EXPECT_EQ(x.mlp_res_proj, y.mlp_res_proj);
    same_matrix(x.kda.q_proj, y.kda.q_proj);
    same_matrix(x.kda.o_proj, y.kda.o_proj);
    EXPECT_EQ(x.kda.v_conv, y.kda.v_conv);
    EXPECT_EQ(x.kda.a_log, y.kda.a_log);
    EXPECT_EQ(x.kda.dt_bias, y.kda.dt_bias);
    same_matrix(x.mla.kv_b_proj, y.mla.kv_b_proj);
    same_mlp(x.dense_mlp, y.dense_mlp);
    same_matrix(x.moe.router.gate, y.moe.router.gate);
    EXPECT_EQ(x.moe.router.score_bias, y.moe.router.score_bias);
    same_matrix(x.moe.latent_up, y.moe.latent_up);
    same_mlp(x.moe.shared, y.moe.shared);
    ASSERT_EQ(x.moe.experts.size(), y.moe.experts.size());
    for (size_t e = 0; e < x.moe.experts.size(); ++e) same_mlp(x.moe.experts[e], y.moe.experts[e]);
  }
}

TEST(WeightsTest, ShardedAndUnprefixedLoadIdentically) {
  const ModelConfig config = Named("k3-tiny-8");
  auto single = Load(CopyOfTiny8("weights_single"));
  ASSERT_TRUE(single.ok()) << single.status();
  RandomCheckpointOptions sharded;
  sharded.shards = 4;
  auto four = Load(Write(config, "weights_four", sharded));
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ((*four)->checkpoint->files().size(), 4u);
  ExpectSameWeights(**single, **four);
  EXPECT_EQ((*single)->selected_bytes, (*four)->selected_bytes);

  RandomCheckpointOptions bare;
  bare.language_model_prefix = false;
  auto unprefixed = Load(Write(config, "weights_bare", bare));
  ASSERT_TRUE(unprefixed.ok()) << unprefixed.status();
  EXPECT_FALSE((*unprefixed)->checkpoint->files()[0]->tensors().count(
      "language_model.model.norm.weight"));
  ExpectSameWeights(**single, **unprefixed);
}

TEST(WeightsTest, F32AndF16Checkpoints) {
  const ModelConfig config = Named("k3-tiny-8");
  const auto layout = CheckpointLayout(config);
  for (DType dtype : {DType::kF32, DType::kF16}) {
    RandomCheckpointOptions options;
    options.dtype = dtype;
    auto w = Load(Write(config, std::string("weights_") + DTypeName(dtype).data(), options));
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelWeights& m = **w;
    // F32 is used in place; F16 is widened into owned storage.
    EXPECT_EQ(m.embed_tokens.type, WeightType::kF32);
    EXPECT_EQ(m.owned.empty(), dtype == DType::kF32);
    ExpectMatrix(m.embed_tokens, layout, "model.embed_tokens.weight", dtype);
    ExpectMatrix(m.layers[1].kda.f_b_proj, layout, "model.layers.1.self_attn.f_b_proj.weight",
                 dtype);
    ExpectMatrix(m.layers[2].moe.experts[3].up, layout,
                 "model.layers.2.block_sparse_moe.experts.3.w3.weight", dtype);
    ExpectVector(m.layers[1].post_attention_layernorm, layout,
                 "model.layers.1.post_attention_layernorm.weight", dtype);
    ExpectVector(m.layers[1].kda.k_conv, layout, "model.layers.1.self_attn.k_conv1d.weight", dtype);
    if (dtype == DType::kF16) {
      bool owned = false;
      for (const auto& storage : m.owned) owned |= storage.data() == m.embed_tokens.data;
      EXPECT_TRUE(owned);
    }
  }
}

// Rewrites the single-file checkpoint in `dir`, letting `edit` change its tensor list.
void Rewrite(const std::string& dir, const std::function<void(std::vector<TensorToWrite>*)>& edit) {
  const std::string path = dir + "/model.safetensors";
  std::vector<TensorToWrite> tensors;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::pair<uint64_t, std::string>> order;
    for (const auto& [name, info] : (*file)->tensors()) order.emplace_back(info.begin, name);
    std::sort(order.begin(), order.end());
    for (const auto& [begin, name] : order) {
      auto view = (*file)->Get(name);
      ASSERT_TRUE(view.ok());
      tensors.push_back({name, view->dtype, view->shape,
                         std::string(reinterpret_cast<const char*>(view->data), view->bytes)});
    }
  }
  edit(&tensors);
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
}

TensorToWrite* Named(std::vector<TensorToWrite>* tensors, const std::string& name) {
  for (TensorToWrite& t : *tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return &tensors->front();
}

std::string F32Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

constexpr char kALog0[] = "language_model.model.layers.0.self_attn.A_log";

TEST(WeightsTest, ALogPaddingRule) {
  const ModelConfig config = Named("k3-tiny-8");
  const std::string dir = CopyOfTiny8("weights_a_log");
  // The release's layout: the heads' values, then zeros (spec §11.1).
  Rewrite(dir, [](std::vector<TensorToWrite>* t) {
    TensorToWrite* a = Named(t, kALog0);
    *a = {a->name, DType::kF32, {8}, F32Bytes({0.5f, 1.5f, 2.5f, 0.25f, 0, 0, 0, 0})};
  });
  auto padded = Load(dir);
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ((*padded)->layers[0].kda.a_log, (std::vector<float>{0.5f, 1.5f, 2.5f, 0.25f}));

  Rewrite(dir, [](std::vector<TensorToWrite>* t) {
    TensorToWrite* a = Named(t, kALog0);
    *a = {a->name, DType::kF32, {8}, F32Bytes({0.5f, 1.5f, 2.5f, 0.25f, 0, 0, 3.0f, 0})};
  });
  auto bad_tail = Load(dir);
  ASSERT_FALSE(bad_tail.ok());
  EXPECT_NE(bad_tail.status().message().find(kALog0), std::string::npos) << bad_tail.status();
  EXPECT_NE(bad_tail.status().message().find("not zero padding"), std::string::npos);

  Rewrite(dir, [](std::vector<TensorToWrite>* t) {
    TensorToWrite* a = Named(t, kALog0);
    *a = {a->name, DType::kF32, {3}, F32Bytes({0.5f, 1.5f, 2.5f})};
  });
  auto short_one = Load(dir);
  ASSERT_FALSE(short_one.ok());
  EXPECT_NE(short_one.status().message().find(kALog0), std::string::npos) << short_one.status();
}

struct Corruption {
  const char* what;
  std::function<void(std::vector<TensorToWrite>*)> edit;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

TEST(WeightsTest, BadTensorsGiveClearErrors) {
  const ModelConfig config = Named("k3-tiny-8");
  const std::string q = "language_model.model.layers.0.self_attn.q_proj.weight";
  const std::string w1 = "language_model.model.layers.2.block_sparse_moe.experts.5.w1.weight";
  const std::vector<Corruption> cases = {
      {"missing",
       [&](std::vector<TensorToWrite>* t) { t->erase(t->begin() + (Named(t, q) - t->data())); },
       absl::StatusCode::kNotFound,
       {"model.layers.0.self_attn.q_proj.weight"}},
      {"misshaped",
       [&](std::vector<TensorToWrite>* t) {
         TensorToWrite* x = Named(t, q);
         x->shape = {256, 128};
       },
       absl::StatusCode::kInvalidArgument,
       {q, "expected shape [128, 256]", "found [256, 128] of BF16", "model.safetensors"}},
      {"wrong dtype",
       [&](std::vector<TensorToWrite>* t) {
         TensorToWrite* x = Named(t, q);
         x->dtype = DType::kI16;
       },
       absl::StatusCode::kInvalidArgument,
       {q, "of I16", "BF16/F16/F32"}},
      {"NaN in a matrix",
       [&](std::vector<TensorToWrite>* t) {
         Named(t, q)->bytes.replace(2 * 1000, 2, "\xc0\x7f");  // BF16 NaN, little-endian
       },
       absl::StatusCode::kDataLoss,
       {q, "value 1000 is nan", "model.safetensors"}},
      {"infinity in a vector",
       [&](std::vector<TensorToWrite>* t) {
         Named(t, "language_model.model.norm.weight")->bytes.replace(2 * 3, 2, "\x80\xff");
       },
       absl::StatusCode::kDataLoss,
       {"language_model.model.norm.weight", "value 3 is -inf"}},
      {"random bytes",
       [&](std::vector<TensorToWrite>* t) {
         std::mt19937 random(5);
         for (char& byte : Named(t, w1)->bytes) byte = static_cast<char>(random());
       },
       absl::StatusCode::kDataLoss,
       {w1, "weights must be finite"}},
      {"MXFP4 expert",
       [&](std::vector<TensorToWrite>* t) {
         TensorToWrite* x = Named(t, w1);
         const std::string base = w1.substr(0, w1.size() - std::string(".weight").size());
         *x = {base + ".weight_packed", DType::kU8, {64, 64}, std::string(64 * 64, '\0')};
         t->push_back({base + ".weight_scale", DType::kU8, {64, 4}, std::string(64 * 4, '\x7f')});
       },
       absl::StatusCode::kInvalidArgument,
       {w1 + "_packed", "no quantization_config"}},
  };
  for (const Corruption& c : cases) {
    const std::string dir = CopyOfTiny8("weights_corrupt");
    Rewrite(dir, c.edit);
    auto w = Load(dir);
    ASSERT_FALSE(w.ok()) << c.what;
    EXPECT_EQ(w.status().code(), c.code) << c.what << ": " << w.status();
    for (const std::string& part : c.message_parts) {
      EXPECT_NE(w.status().message().find(part), std::string::npos)
          << c.what << ": expected \"" << part << "\" in: " << w.status().message();
    }
  }
}

// The scan for NaN and infinity at load, in every float dtype, at the first and last element and
// across the scan's blocks.
TEST(WeightsTest, NonFiniteValuesAreFoundInEveryDtype) {
  const ModelConfig config = Named("k3-tiny-8");
  const std::string e = "language_model.model.embed_tokens.weight";  // [512, 256]
  struct Case {
    DType dtype;
    std::string bad;  // a non-finite value in the dtype's little-endian bytes
    std::string shown;
    std::string one;  // 1.0, which replaces the earlier iterations' bad values
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {DType::kF32, std::string(reinterpret_cast<const char*>(&inf), 4), "inf",
       std::string("\x00\x00\x80\x3f", 4)},
      {DType::kF16, std::string("\x00\x7e", 2), "nan", std::string("\x00\x3c", 2)},
      {DType::kBf16, std::string("\x80\x7f", 2), "inf", std::string("\x80\x3f", 2)}};
  for (const Case& c : cases) {
    RandomCheckpointOptions options;
    options.dtype = c.dtype;
    const std::string name(DTypeName(c.dtype));
    const std::string dir = Write(config, "weights_finite_" + name, options);
    ASSERT_TRUE(Load(dir).ok());
    const size_t size = c.bad.size();
    for (int64_t index : {int64_t{0}, int64_t{1023}, int64_t{1024}, int64_t{512 * 256 - 1}}) {
      Rewrite(dir, [&](std::vector<TensorToWrite>* t) {
        std::string& data = Named(t, e)->bytes;
        for (size_t at = 0; at < data.size(); at += size) {
          if (data.compare(at, size, c.bad) == 0) data.replace(at, size, c.one);
        }
        data.replace(index * size, size, c.bad);
      });
      auto w = Load(dir);
      EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss) << name;
      EXPECT_TRUE(absl::StrContains(w.status().message(), absl::StrCat(e, "' in ")) &&
                  absl::StrContains(w.status().message(),
                                    absl::StrCat("value ", index, " is ", c.shown)))
          << name << " at " << index << ": " << w.status();
    }
  }
}

TEST(WeightsTest, SqueezedConvAndMisalignedTensors) {
  const ModelConfig config = Named("k3-tiny-8");
  const std::string reference_dir = CopyOfTiny8("weights_reference");
  auto reference = Load(reference_dir);
  ASSERT_TRUE(reference.ok()) << reference.status();

  const std::string dir = CopyOfTiny8("weights_odd_layout");
  Rewrite(dir, [](std::vector<TensorToWrite>* t) {
    for (TensorToWrite& x : *t) {
      if (x.name.ends_with("conv1d.weight")) x.shape = {x.shape[0], x.shape[2]};
    }
    // One byte up front shifts every later tensor to an odd offset.
    t->insert(t->begin(), TensorToWrite{"padding", DType::kU8, {1}, "x"});
  });
  auto odd = Load(dir);
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_NE(reinterpret_cast<uintptr_t>(
                (*odd)->checkpoint->Find("model.embed_tokens.weight")->data) % 2, 0u);
  EXPECT_EQ((*odd)->embed_tokens.type, WeightType::kF32);  // widened, not used misaligned
  ExpectSameWeights(**reference, **odd);
}

TEST(WeightsTest, TiedEmbeddings) {
  ModelConfig config = Named("k3-tiny-8");
  config.tie_word_embeddings = true;
  auto w = Load(Write(config, "weights_tied"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->lm_head.data, (*w)->embed_tokens.data);
}

TEST(WeightsTest, SelectionLoadsOnlyItsShare) {
  const ModelConfig config = Named("k3-tiny-8");
  const auto layout = CheckpointLayout(config);
  const std::string dir = CopyOfTiny8("weights_selection");
  // Break expert 7 everywhere: only selections that include it may notice.
  Rewrite(dir, [](std::vector<TensorToWrite>* t) {
    for (TensorToWrite& x : *t) {
      if (x.name.find(".experts.7.") != std::string::npos) x.dtype = DType::kI16;
    }
  });
  EXPECT_FALSE(Load(dir).ok());

  auto bytes_of = [&](const std::function<bool(const TensorSlot&)>& pick) {
    size_t bytes = 0, count = 0;
    for (const TensorSlot& slot : layout) {
      if (!pick(slot)) continue;
      const bool matrix = slot.init == TensorInit::kLinear || slot.init == TensorInit::kEmbedding;
      bytes += slot.numel() * (matrix ? 2 : 4);
      ++count;
    }
    return std::pair{bytes, count};
  };
  auto is_router = [](const TensorSlot& s) {
    return s.name.find(".gate.") != std::string::npos ||
           s.name.find("routed_expert_down_proj") != std::string::npos ||
           s.name.find("routed_expert_norm") != std::string::npos;
  };

  size_t total = 0;
  auto count_progress = [&](size_t, size_t t) { total = t; };

  auto attention = Load(dir, WeightSelection::AttentionOnly(), count_progress);
  ASSERT_TRUE(attention.ok()) << attention.status();
  auto [attention_bytes, attention_count] =
      bytes_of([&](const TensorSlot& s) { return s.expert < 0 && !is_router(s); });
  EXPECT_EQ((*attention)->selected_bytes, attention_bytes);
  EXPECT_EQ(total, attention_count);
  const LayerWeights& l2 = (*attention)->layers[2];
  EXPECT_FALSE(l2.kda.q_proj.empty());
  EXPECT_FALSE(l2.moe.latent_up.empty());
  EXPECT_FALSE(l2.moe.shared.gate.empty());
  EXPECT_TRUE(l2.moe.router.gate.empty());
  EXPECT_TRUE(l2.moe.router.score_bias.empty());
  for (const auto& e : l2.moe.experts) EXPECT_TRUE(e.gate.empty());

  auto router = Load(dir, WeightSelection::RouterOnly(), count_progress);
  ASSERT_TRUE(router.ok()) << router.status();
  auto [router_bytes, router_count] = bytes_of(is_router);
  EXPECT_EQ((*router)->selected_bytes, router_bytes);
  EXPECT_EQ(total, router_count);
  EXPECT_TRUE((*router)->embed_tokens.empty());
  EXPECT_FALSE((*router)->layers[2].moe.router.gate.empty());
  EXPECT_FALSE((*router)->layers[2].moe.router.latent_norm.empty());
  EXPECT_TRUE((*router)->layers[2].moe.latent_up.empty());
  EXPECT_TRUE((*router)->layers[2].kda.q_proj.empty());

  auto experts = Load(dir, WeightSelection::Experts({3, 1, 3}), count_progress);
  ASSERT_TRUE(experts.ok()) << experts.status();
  auto [expert_bytes, expert_count] =
      bytes_of([](const TensorSlot& s) { return s.expert == 1 || s.expert == 3; });
  EXPECT_EQ((*experts)->selected_bytes, expert_bytes);
  EXPECT_EQ(total, expert_count);
  for (const LayerWeights& layer : (*experts)->layers) {
    if (!layer.is_moe) continue;
    for (int e = 0; e < config.num_experts; ++e) {
      EXPECT_EQ(layer.moe.experts[e].gate.empty(), e != 1 && e != 3) << e;
    }
    EXPECT_TRUE(layer.moe.router.gate.empty());
    EXPECT_TRUE(layer.input_layernorm.empty());
  }
  ExpectMatrix((*experts)->layers[5].moe.experts[3].down, layout,
               "model.layers.5.block_sparse_moe.experts.3.w2.weight", DType::kBf16);

  auto broken = Load(dir, WeightSelection::Experts({7}));
  EXPECT_FALSE(broken.ok());
  auto out_of_range = Load(dir, WeightSelection::Experts({32}));
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
}

// A fresh copy of one MXFP4 k3-tiny-8 checkpoint written once per test binary.
std::string CopyOfTiny8Mxfp4(const std::string& name) {
  static const std::string* base = [] {
    RandomCheckpointOptions options;
    options.mxfp4 = true;
    return new std::string(Write(Named("k3-tiny-8"), "weights_tiny8_mxfp4_base", options));
  }();
  const std::string dir = Fresh(name);
  std::filesystem::copy(*base, dir);
  return dir;
}

// Element (r, c) of an MXFP4 pair read straight from the file's bytes.
double FileMxfp4(const Checkpoint& ckpt, const std::string& base, int64_t r, int64_t c) {
  const TensorView codes = *ckpt.Find(base + ".weight_packed");
  const TensorView scales = *ckpt.Find(base + ".weight_scale");
  const int64_t cols = codes.shape[1] * 2;
  const uint8_t byte = codes.data[r * cols / 2 + c / 2];
  const int code = c % 2 == 0 ? byte & 0xf : byte >> 4;
  const double magnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double value = (code & 8 ? -1 : 1) * magnitude[code & 7];
  return std::ldexp(value, scales.data[r * cols / 32 + c / 32] - 127);
}

TEST(WeightsMxfp4Test, ExpertsMapThePackedBytesAndEverythingElseStaysBf16) {
  const ModelConfig config = Named("k3-tiny-8");
  const auto layout = CheckpointLayout(config);
  auto w = Load(CopyOfTiny8Mxfp4("weights_mxfp4"));
  ASSERT_TRUE(w.ok()) << w.status();
  const Checkpoint& ckpt = *(*w)->checkpoint;
  EXPECT_TRUE((*w)->config.quantization.has_value());
  const std::string base = "model.layers.2.block_sparse_moe.experts.5.w2";
  const WeightMatrix& down = (*w)->layers[2].moe.experts[5].down;
  ASSERT_EQ(down.type, WeightType::kMxfp4);
  // A view of the mapping, not a copy.
  EXPECT_EQ(down.data, ckpt.Find(base + ".weight_packed")->data);
  EXPECT_EQ(down.scales, ckpt.Find(base + ".weight_scale")->data);
  RandomCheckpointOptions options;
  std::vector<float> original;
  for (const TensorSlot& slot : layout) {
    if (slot.name == base + ".weight") original = RandomTensorValues(slot, kSeed, options);
  }
  ASSERT_EQ(static_cast<int64_t>(original.size()), down.rows * down.cols);
  for (int64_t r = 0; r < down.rows; ++r) {
    for (int64_t c = 0; c < down.cols; ++c) {
      ASSERT_EQ(down.At(r, c), FileMxfp4(ckpt, base, r, c)) << r << "," << c;
      // Within the rounding of its group: at most one scale step of 2^(s-127) at the top.
      const double scale =
          std::ldexp(1.0, ckpt.Find(base + ".weight_scale")->data[r * 2 + c / 32] - 127);
      ASSERT_LE(std::abs(down.At(r, c) - original[r * down.cols + c]), scale) << r << "," << c;
    }
  }
  EXPECT_EQ((*w)->layers[2].moe.shared.gate.type, WeightType::kBf16);
  EXPECT_EQ((*w)->layers[2].kda.q_proj.type, WeightType::kBf16);
  EXPECT_EQ((*w)->layers[2].moe.router.gate.type, WeightType::kBf16);

  // An expert worker's share is exactly its experts' packed bytes and scales.
  auto experts = Load(CopyOfTiny8Mxfp4("weights_mxfp4_experts"), WeightSelection::Experts({1, 4}));
  ASSERT_TRUE(experts.ok()) << experts.status();
  size_t expected = 0;
  for (const TensorSlot& slot : layout) {
    if (slot.expert == 1 || slot.expert == 4) expected += slot.numel() / 2 + slot.numel() / 32;
  }
  EXPECT_EQ((*experts)->selected_bytes, expected);
}

TEST(WeightsMxfp4Test, BadPackedTensorsGiveClearErrors) {
  const std::string w1 = "language_model.model.layers.2.block_sparse_moe.experts.5.w1";
  const std::string q = "language_model.model.layers.0.self_attn.q_proj";
  auto set_scale = [&](uint8_t value) {
    return [=](std::vector<TensorToWrite>* t) {
      Named(t, w1 + ".weight_scale")->bytes[3 * 4 + 2] =
          static_cast<char>(value);  // row 3, group 2
    };
  };
  const std::vector<Corruption> cases = {
      {"NaN scale",
       set_scale(255),
       absl::StatusCode::kInvalidArgument,
       {w1 + ".weight_scale", "row 3, group 2", "scale byte 255", "NaN"}},
      {"overflowing scale",
       set_scale(253),
       absl::StatusCode::kInvalidArgument,
       {w1 + ".weight_scale", "row 3, group 2", "scale byte 253", "overflow"}},
      {"codes misshaped",
       [&](std::vector<TensorToWrite>* t) {
         Named(t, w1 + ".weight_packed")->shape = {32, 128};
       },
       absl::StatusCode::kInvalidArgument,
       {w1 + ".weight_packed", "expected MXFP4 codes of shape [64, 64] of U8", "found [32, 128]"}},
      {"scales of a float dtype",
       [&](std::vector<TensorToWrite>* t) {
         TensorToWrite* x = Named(t, w1 + ".weight_scale");
         *x = {x->name, DType::kF32, {64, 4}, std::string(64 * 4 * 4, '\0')};
       },
       absl::StatusCode::kInvalidArgument,
       {w1 + ".weight_scale", "of U8 or F8_E8M0", "of F32"}},
      {"scales missing",
       [&](std::vector<TensorToWrite>* t) {
         t->erase(t->begin() + (Named(t, w1 + ".weight_scale") - t->data()));
       },
       absl::StatusCode::kNotFound,
       {"experts.5.w1.weight_scale"}},
      {"a packed attention matrix",
       [&](std::vector<TensorToWrite>* t) {
         TensorToWrite* x = Named(t, q + ".weight");
         *x = {q + ".weight_packed", DType::kU8, {128, 128}, std::string(128 * 128, '\0')};
         t->push_back({q + ".weight_scale", DType::kU8, {128, 8}, std::string(128 * 8, '\x7f')});
       },
       absl::StatusCode::kUnimplemented,
       {q + ".weight_packed", "routed experts only"}},
  };
  for (const Corruption& c : cases) {
    const std::string dir = CopyOfTiny8Mxfp4("weights_mxfp4_corrupt");
    Rewrite(dir, c.edit);
    auto w = Load(dir);
    ASSERT_FALSE(w.ok()) << c.what;
    EXPECT_EQ(w.status().code(), c.code) << c.what << ": " << w.status();
    for (const std::string& part : c.message_parts) {
      EXPECT_NE(w.status().message().find(part), std::string::npos)
          << c.what << ": expected \"" << part << "\" in: " << w.status().message();
    }
  }
}

TEST(WeightsMxfp4Test, ConfigMustDeclareTheExpertsQuantized) {
  ModelConfig config = Named("k3-tiny-8");
  for (const char* ignore : {"", "re:.*experts.*"}) {
    const std::string dir = CopyOfTiny8Mxfp4("weights_mxfp4_config");
    if (*ignore == '\0') {
      config.quantization.reset();
    } else {
      config.quantization = QuantizationConfig{{ignore}};
    }
    std::ofstream(dir + "/config.json") << ModelConfigToJson(config);
    auto w = Load(dir);
    ASSERT_FALSE(w.ok()) << ignore;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find(*ignore == '\0' ? "no quantization_config"
                                                        : "ignore list leaves module"),
              std::string::npos)
        << w.status();
  }
}

}  // namespace
}  // namespace k3
