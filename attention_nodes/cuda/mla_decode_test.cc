// Absorbed MLA decode on a GPU (mla_decode.cu) against the CPU layer
// (attention_nodes/forward/mla.cc) and against an fp64 softmax over the same bf16 cache. A batch of
// sequences with caches of different lengths (1 token, across a page boundary, several pages; rows
// N(0,1) rounded to bf16, so the CPU and the GPU's bf16 pool hold the same values) decodes one
// token each:
//  - the CPU runs MlaForwardBatch (absorbed form), which appends the token's latent row in fp32;
//  - the test absorbs the query heads as mla.cc does, the GPU attends over the bf16 pages (the new
//    row rounded to bf16: the one difference), and the test expands the latents with W_V, applies
//    the output gate and o_proj.
// Bounds:
//  - against the CPU layer: 4e-3 of max |cpu|. The new row's values differ by at most 2^-9
//    relative (bf16 rounding), which moves its score and its value by about that much; its weight
//    is at most 1, so the output moves by at most ~2 x 2^-9 ≈ 4e-3 of the values' scale (random
//    weights make it far smaller); fp32 sum order adds ~1e-6. The sequence with an empty history
//    is the worst: its one key is the new row, so its output is that row's bf16 rounding through
//    W_V and o_proj. On these seeds an fp64 evaluation of the kernel's contract (mla_decode.h)
//    differs from mla.cc by at most 2.0e-3 (k3-tiny) and 1.3e-3 (k3-slice widths).
//  - against the fp64 softmax of the same bf16 rows and the same fp32 queries: 1e-4 (fp32 dot
//    products of 576 terms and fp32 exponentials, ~1e-6; 100x room).
// Widths: k3-tiny (4 heads, c 64, r 16) and k3-slice's attention (96 heads, c 512, r 64; the hidden
// size, which only the projections see, stays small). Without a GPU these cases report themselves
// skipped ("no GPU"); the shape checks run anyway.
#include "attention_nodes/cuda/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cuda/gpu_test_util.h"
#include "attention_nodes/forward/mla.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/matmul.h"
#include "kernels/rms_norm.h"
#include "model/config.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;

constexpr int kPageSize = 64;

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

// q_b_proj and kv_b_proj at std 0.15 give scores of std ~1-3 at both widths (a peaked softmax,
// so a wrong weight shows).
MlaWeights MakeWeights(const ModelConfig& config, RandomWeights* rnd) {
  const int64_t h = config.num_attention_heads, d = config.hidden_size;
  const int64_t qhd = config.MlaQHeadDim(), c = config.kv_lora_rank, r = config.qk_rope_head_dim;
  const int64_t vd = config.v_head_dim, ql = config.q_lora_rank.value_or(0);
  EXPECT_GT(ql, 0);
  MlaWeights w;
  w.q_a_proj = rnd->Matrix(ql, d, 0.1f);
  w.q_a_layernorm = rnd->Normal(ql, 1.0f, 0.1f);
  w.q_b_proj = rnd->Matrix(h * qhd, ql, 0.15f);
  w.kv_a_proj_with_mqa = rnd->Matrix(c + r, d, 0.1f);
  w.kv_a_layernorm = rnd->Normal(c, 1.0f, 0.1f);
  w.kv_b_proj = rnd->Matrix(h * (config.qk_nope_head_dim + vd), c, 0.15f);
  if (config.mla_use_output_gate) w.g_proj = rnd->Matrix(h * vd, d, 0.05f);
  w.o_proj = rnd->Matrix(d, h * vd, 0.05f);
  return w;
}

// The absorbed, pre-scaled queries [batch, H, c + r] of tokens x [batch, d], as mla.cc forms them.
std::vector<float> AbsorbedQueries(const ModelConfig& config, const MlaWeights& w,
                                   const std::vector<float>& x, int batch) {
  const int64_t h = config.num_attention_heads, nope = config.qk_nope_head_dim;
  const int64_t qhd = config.MlaQHeadDim(), c = config.kv_lora_rank, r = config.qk_rope_head_dim;
  const int64_t ql = *config.q_lora_rank, kv_width = nope + config.v_head_dim;
  std::vector<float> latent(batch * ql), q(batch * h * qhd);
  MatMul(w.q_a_proj, x.data(), batch, latent.data());
  RmsNormRows(latent.data(), ql, batch, ql, w.q_a_layernorm.data(), kMlaLatentNormEps,
              latent.data(), ql);
  MatMul(w.q_b_proj, latent.data(), batch, q.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(qhd));
  std::vector<float> q_abs(batch * h * (c + r));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t head = 0; head < h; ++head) {
      const float* qh = q.data() + (b * h + head) * qhd;
      float* out = q_abs.data() + (b * h + head) * (c + r);
      for (int64_t col = 0; col < c; ++col) {
        float sum = 0.0f;
        for (int64_t j = 0; j < nope; ++j) sum += w.kv_b_proj.At(head * kv_width + j, col) * qh[j];
        out[col] = sum * scale;
      }
      for (int64_t j = 0; j < r; ++j) out[c + j] = qh[nope + j] * scale;
    }
  }
  return q_abs;
}

// Σ_n softmax_n(q · row_n) row_n[:c] in fp64, per (sequence, head).
std::vector<double> ReferenceLatents(const std::vector<float>& q_abs,
                                     const std::vector<std::vector<float>>& rows, int64_t heads,
                                     int64_t c, int64_t width) {
  std::vector<double> out;
  for (size_t b = 0; b < rows.size(); ++b) {
    const int64_t length = static_cast<int64_t>(rows[b].size()) / width;
    for (int64_t head = 0; head < heads; ++head) {
      const float* q = q_abs.data() + (b * heads + head) * width;
      std::vector<double> scores(length);
      for (int64_t n = 0; n < length; ++n) {
        double s = 0;
        for (int64_t d = 0; d < width; ++d) s += static_cast<double>(q[d]) * rows[b][n * width + d];
        scores[n] = s;
      }
      const double best = *std::max_element(scores.begin(), scores.end());
      std::vector<double> sum(c, 0.0);
      double total = 0;
      for (int64_t n = 0; n < length; ++n) {
        const double weight = std::exp(scores[n] - best);
        total += weight;
        for (int64_t col = 0; col < c; ++col) sum[col] += weight * rows[b][n * width + col];
      }
      for (double v : sum) out.push_back(v / total);
    }
  }
  return out;
}

float RoundBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

void ExpectDecodeMatchesCpu(const ModelConfig& config, const std::vector<int>& history,
                            int keys_per_split, uint32_t seed) {
  RandomWeights rnd(seed);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int batch = static_cast<int>(history.size());
  const int64_t d = config.hidden_size, h = config.num_attention_heads;
  const int64_t c = config.kv_lora_rank, r = config.qk_rope_head_dim, width = c + r;
  const int64_t nope = config.qk_nope_head_dim, vd = config.v_head_dim, kv_width = nope + vd;

  std::vector<MlaCache> caches(batch, MlaCache(config));
  std::vector<MlaSegment> segments;
  for (int b = 0; b < batch; ++b) {
    caches[b].Reserve(history[b] + 1);
    const std::vector<float> values = rnd.Normal(history[b] * width, 0.0f, 1.0f);
    std::transform(values.begin(), values.end(), caches[b].rows.begin(), RoundBf16);
    caches[b].length = history[b];
    segments.push_back(MlaSegment{&caches[b], 1});
  }
  const std::vector<float> x = rnd.Normal(batch * d, 0.0f, 1.0f);
  std::vector<float> cpu_out(batch * d);
  Scratch scratch;
  ASSERT_TRUE(MlaForwardBatch(config, w, x.data(), segments, cpu_out.data(), &scratch,
                              MlaForm::kAbsorbed)
                  .ok());

  // The bf16 page pool: sequence b's pages interleaved with the others' (page i of b is
  // i * batch + b), plus one unused page 0.
  int max_pages = 0, max_length = 0;
  std::vector<std::vector<float>> rows(batch);
  for (int b = 0; b < batch; ++b) {
    const int length = static_cast<int>(caches[b].length);
    max_length = std::max(max_length, length);
    max_pages = std::max(max_pages, (length + kPageSize - 1) / kPageSize);
    rows[b].assign(caches[b].rows.begin(), caches[b].rows.begin() + length * width);
    for (float& v : rows[b]) v = RoundBf16(v);
  }
  const int pages = 1 + max_pages * batch;
  std::vector<uint16_t> pool(pages * kPageSize * width, FloatToBf16(NAN));
  std::vector<int32_t> block_table(batch * max_pages, 0), lengths(batch);
  for (int b = 0; b < batch; ++b) {
    lengths[b] = static_cast<int32_t>(caches[b].length);
    for (int64_t n = 0; n < lengths[b]; ++n) {
      const int32_t page = 1 + static_cast<int32_t>(n / kPageSize) * batch + b;
      block_table[b * max_pages + n / kPageSize] = page;
      for (int64_t j = 0; j < width; ++j) {
        pool[(page * kPageSize + n % kPageSize) * width + j] = FloatToBf16(rows[b][n * width + j]);
      }
    }
  }
  const std::vector<float> q_abs = AbsorbedQueries(config, w, x, batch);

  DeviceArray<uint16_t> pool_dev(pool);
  DeviceArray<int32_t> table_dev(block_table), lengths_dev(lengths);
  DeviceArray<float> q_dev(q_abs), out_dev(batch * h * c);
  MlaDecodeLaunch launch;
  launch.batch = batch;
  launch.heads = static_cast<int32_t>(h);
  launch.kv_lora_rank = static_cast<int32_t>(c);
  launch.rope_dim = static_cast<int32_t>(r);
  launch.page_size = kPageSize;
  launch.max_pages = max_pages;
  launch.max_length = max_length;
  launch.keys_per_split = keys_per_split;
  launch.lengths = lengths_dev.get();
  launch.block_table = table_dev.get();
  launch.cache = pool_dev.get();
  launch.q = q_dev.get();
  DeviceArray<float> workspace(MlaDecodeWorkspaceFloats(launch));
  launch.workspace = workspace.get();
  launch.out = out_dev.get();
  const std::vector<double> reference = ReferenceLatents(q_abs, rows, h, c, width);

  {
    ASSERT_EQ(LaunchMlaDecode(launch, nullptr), 0);
    gpu_test::ExpectDeviceOk();
    const std::vector<float> latents = out_dev.Download();
    EXPECT_TRUE(AllClose(latents, reference, 1e-4));

    // The rest of the layer on the host: O_h = W_V[h] latent_h, the gate, o_proj.
    std::vector<float> o(batch * h * vd), gate(batch * h * vd), gpu_out(batch * d);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t head = 0; head < h; ++head) {
        for (int64_t j = 0; j < vd; ++j) {
          float sum = 0.0f;
          for (int64_t col = 0; col < c; ++col) {
            sum += w.kv_b_proj.At(head * kv_width + nope + j, col) *
                   latents[(b * h + head) * c + col];
          }
          o[(b * h + head) * vd + j] = sum;
        }
      }
    }
    if (config.mla_use_output_gate) {
      MatMul(w.g_proj, x.data(), batch, gate.data());
      for (size_t i = 0; i < o.size(); ++i) o[i] /= 1.0f + std::exp(-gate[i]);
    }
    MatMul(w.o_proj, o.data(), batch, gpu_out.data());
    EXPECT_TRUE(AllClose(gpu_out, cpu_out, 4e-3));
  }
}

TEST(MlaDecodeGpuTest, MatchesCpuAtK3TinyWidths) {
  REQUIRE_GPU();
  const ModelConfig config = Named("k3-tiny");
  // 32 keys per split: several splits, and a last split with a partial tile.
  ExpectDecodeMatchesCpu(config, {0, 63, 200}, 32, 1);
  ExpectDecodeMatchesCpu(config, {0, 63, 200}, MlaKeysPerSplit(3, 4, 201), 2);
}

TEST(MlaDecodeGpuTest, MatchesCpuAtK3SliceWidths) {
  REQUIRE_GPU();
  const ModelConfig config = SliceWidths();
  ExpectDecodeMatchesCpu(config, {0, 700, 2100}, MlaKeysPerSplit(3, 96, 2101), 3);
  ExpectDecodeMatchesCpu(config, {129}, 64, 4);
}

TEST(MlaDecodeGpuTest, RefusesShapesItDoesNotHandle) {
  MlaDecodeLaunch launch;
  launch.batch = 1;
  launch.heads = 96;
  launch.kv_lora_rank = 512;
  launch.rope_dim = 64;
  launch.max_pages = 1;
  launch.max_length = 1;
  launch.keys_per_split = 40;  // not a multiple of 16
  EXPECT_NE(LaunchMlaDecode(launch, nullptr), 0);
  launch.keys_per_split = 64;
  launch.rope_dim = 66;  // 578 > 576
  EXPECT_NE(LaunchMlaDecode(launch, nullptr), 0);
  launch.rope_dim = 64;
  launch.kv_lora_rank = 513;
  EXPECT_NE(LaunchMlaDecode(launch, nullptr), 0);
}

// Host-side: the split size is a whole number of tiles, and it spreads a batch over about four
// 8-head blocks per SM (528 on an H200) when the keys allow it.
TEST(MlaDecodeGpuTest, KeysPerSplitSpreadsTheWork) {
  for (int batch : {1, 8, 32}) {
    for (int length : {1, 2048, 32768}) {
      const int keys = MlaKeysPerSplit(batch, 96, length);
      EXPECT_EQ(keys % kMlaDecodeKeyTile, 0);
      EXPECT_GE(keys, 64);
      const int64_t blocks = (length + keys - 1) / keys * batch * 12;
      EXPECT_GE(blocks, std::min<int64_t>(528, batch * 12 * ((length + 63) / 64)))
          << batch << " x " << length;
    }
  }
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
