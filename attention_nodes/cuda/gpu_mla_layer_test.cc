// GpuMlaLayer (gpu_mla_layer.cc) against the CPU layer, attention_nodes/forward/mla.cc, on random
// BF16 weights (as mla_decode_test.cc makes them): three sequences prefill histories of different
// lengths in one call (rows of several sequences, crossing pages), then decode three tokens each,
// at k3-tiny's widths (4 heads, c 64, r 16, pages of 16) and k3-slice's attention (96 heads, c 512,
// r 64, pages of 64; a small hidden size). The CPU uses its expanded form for the prefill and the
// absorbed form for decode; the GPU the absorbed form throughout.
//
// Tolerance: the GPU keeps the cache in bf16 and rounds the rows entering each product to bf16
// (the CPU keeps fp32); each rounding is 2^-9 relative, and mla_decode_test.cc bounds the cache
// rounding's effect on the attention alone by 4e-3: bound 2e-2 of max |cpu| for the layer output.
// Without a GPU the GPU cases report themselves skipped ("no GPU").
#include "attention_nodes/cuda/gpu_mla_layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_nodes/forward/mla.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/config.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;

constexpr double kBound = 2e-2;

ModelConfig Named(const char* name) {
  absl::StatusOr<ModelConfig> config = NamedConfig(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

ModelConfig SliceWidths() {
  ModelConfig config = Named("k3-tiny");
  config.num_attention_heads = 96;
  config.num_key_value_heads = 96;
  config.kv_lora_rank = 512;
  config.qk_rope_head_dim = 64;
  config.qk_nope_head_dim = 128;
  config.v_head_dim = 128;
  return config;
}

MlaWeights MakeWeights(const ModelConfig& config, RandomWeights* rnd) {
  const int64_t h = config.num_attention_heads, d = config.hidden_size;
  const int64_t qhd = config.MlaQHeadDim(), c = config.kv_lora_rank, r = config.qk_rope_head_dim;
  const int64_t vd = config.v_head_dim, ql = config.q_lora_rank.value_or(0);
  MlaWeights w;
  if (ql > 0) {
    w.q_a_proj = rnd->Matrix(ql, d, 0.1f);
    w.q_a_layernorm = rnd->Normal(ql, 1.0f, 0.1f);
    w.q_b_proj = rnd->Matrix(h * qhd, ql, 0.15f);
  } else {
    w.q_proj = rnd->Matrix(h * qhd, d, 0.15f);
  }
  w.kv_a_proj_with_mqa = rnd->Matrix(c + r, d, 0.1f);
  w.kv_a_layernorm = rnd->Normal(c, 1.0f, 0.1f);
  w.kv_b_proj = rnd->Matrix(h * (config.qk_nope_head_dim + vd), c, 0.15f);
  if (config.mla_use_output_gate) w.g_proj = rnd->Matrix(h * vd, d, 0.05f);
  w.o_proj = rnd->Matrix(d, h * vd, 0.05f);
  return w;
}

// The device arrays of one call: `tokens[s]` new tokens of sequence s after `cached[s]`;
// sequence s owns pages [s * max_pages, (s + 1) * max_pages) in reverse order.
struct Rows {
  std::vector<int32_t> position, lengths, tables;
  int32_t max_length = 0;
};

Rows MakeRows(const std::vector<int>& cached, const std::vector<int>& tokens, int32_t max_pages) {
  Rows rows;
  for (size_t s = 0; s < tokens.size(); ++s) {
    for (int t = 0; t < tokens[s]; ++t) {
      rows.position.push_back(cached[s] + t);
      rows.lengths.push_back(cached[s] + t + 1);
      rows.max_length = std::max(rows.max_length, cached[s] + t + 1);
      for (int32_t p = 0; p < max_pages; ++p) {
        rows.tables.push_back(static_cast<int32_t>((s + 1) * max_pages - 1 - p));
      }
    }
  }
  return rows;
}

void ExpectMatchesCpu(const ModelConfig& config, int32_t page_size, uint32_t seed) {
  RandomWeights rnd(seed);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  const std::vector<int> history = {1, 2 * page_size + 3, page_size};
  const int sequences = static_cast<int>(history.size());
  const int32_t max_pages = 4;  // enough for the longest history and three tokens
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  auto layer = GpuMlaLayer::Create(config, w, sequences * max_pages, page_size, products->get());
  ASSERT_TRUE(layer.ok()) << layer.status();

  std::vector<MlaCache> caches(sequences, MlaCache(config));
  Scratch scratch;
  std::vector<int> cached(sequences, 0);
  // One prefill call with every history, then three decode calls of one token per sequence.
  std::vector<std::vector<int>> calls = {history};
  for (int step = 0; step < 3; ++step) calls.push_back(std::vector<int>(sequences, 1));
  for (size_t call = 0; call < calls.size(); ++call) {
    SCOPED_TRACE(testing::Message() << "call " << call);
    const std::vector<int>& tokens = calls[call];
    int64_t total = 0;
    std::vector<MlaSegment> segments;
    for (int s = 0; s < sequences; ++s) {
      total += tokens[s];
      segments.push_back(MlaSegment{&caches[s], tokens[s]});
    }
    const std::vector<float> x = rnd.Normal(total * d, 0.0f, 1.0f);
    std::vector<float> cpu_out(total * d);
    ASSERT_TRUE(MlaForwardBatch(config, w, x.data(), segments, cpu_out.data(), &scratch).ok());

    const Rows rows = MakeRows(cached, tokens, max_pages);
    DeviceArray<int32_t> position(rows.position), lengths(rows.lengths), tables(rows.tables);
    DeviceArray<float> x_dev(x), out(total * d);
    GpuMlaRows gpu_rows;
    gpu_rows.rows = static_cast<int32_t>(total);
    gpu_rows.max_pages = max_pages;
    gpu_rows.max_length = rows.max_length;
    gpu_rows.position = position.get();
    gpu_rows.lengths = lengths.get();
    gpu_rows.row_tables = tables.get();
    ASSERT_TRUE((*layer)->Forward(x_dev.get(), gpu_rows, out.get()).ok());
    gpu_test::ExpectDeviceOk();
    EXPECT_TRUE(AllClose(out.Download(), cpu_out, kBound));
    for (int s = 0; s < sequences; ++s) cached[s] += tokens[s];
  }
}

TEST(GpuMlaLayerTest, MatchesCpuAtK3TinyWidths) {
  REQUIRE_GPU();
  ExpectMatchesCpu(Named("k3-tiny"), 16, 1);
}

TEST(GpuMlaLayerTest, MatchesCpuAtK3SliceWidths) {
  REQUIRE_GPU();
  ExpectMatchesCpu(SliceWidths(), 64, 2);
}

TEST(GpuMlaLayerTest, RefusesWhatItCannotRun) {
  REQUIRE_GPU();  // the products' cuBLAS handle needs a device
  ModelConfig config = Named("k3-tiny");
  RandomWeights rnd(3);
  MlaWeights w = MakeWeights(config, &rnd);
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok());
  w.o_proj = rnd.Matrix(w.o_proj.rows, w.o_proj.cols, 0.05f, WeightType::kF32);
  EXPECT_EQ(GpuMlaLayer::Create(config, w, 4, 16, products->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.kv_lora_rank = 600;
  EXPECT_EQ(GpuMlaLayer::Create(config, w, 4, 16, products->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
