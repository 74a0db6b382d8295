// MakeSyntheticWeights gives every tensor LoadWeights gives for the same config, with the same
// shape and dtype (compared field by field with a random MXFP4 checkpoint of k3-tiny loaded by
// LoadWeights), values of the intended scale, and at k3-slice every parameter the spec counts.
#include "bench/synthetic_weights.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "bench/step_bytes.h"
#include "kernels/bf16.h"
#include "model/random_checkpoint.h"

namespace k3 {
namespace {

void ExpectSame(const WeightMatrix& a, const WeightMatrix& b, const std::string& what) {
  EXPECT_EQ(a.empty(), b.empty()) << what;
  EXPECT_EQ(a.type, b.type) << what;
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.scales == nullptr, b.scales == nullptr) << what;
}

void ExpectSame(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
}

void ExpectSame(const GatedMlpWeights& a, const GatedMlpWeights& b, const std::string& what) {
  ExpectSame(a.gate, b.gate, what + ".gate");
  ExpectSame(a.up, b.up, what + ".up");
  ExpectSame(a.down, b.down, what + ".down");
}

void ExpectSameLayer(const LayerWeights& a, const LayerWeights& b, const std::string& p) {
  EXPECT_EQ(a.is_kda, b.is_kda) << p;
  EXPECT_EQ(a.is_moe, b.is_moe) << p;
  for (auto [x, y, name] : {std::tuple{&a.input_layernorm, &b.input_layernorm, "input_norm"},
                            {&a.post_attention_layernorm, &b.post_attention_layernorm, "post"},
                            {&a.attn_res_norm, &b.attn_res_norm, "attn_res_norm"},
                            {&a.attn_res_proj, &b.attn_res_proj, "attn_res_proj"},
                            {&a.mlp_res_norm, &b.mlp_res_norm, "mlp_res_norm"},
                            {&a.mlp_res_proj, &b.mlp_res_proj, "mlp_res_proj"}}) {
    ExpectSame(*x, *y, p + name);
  }
  const KdaWeights &k = a.kda, &l = b.kda;
  for (auto [x, y] : {std::pair{&k.q_proj, &l.q_proj},
                      {&k.k_proj, &l.k_proj},
                      {&k.v_proj, &l.v_proj},
                      {&k.f_a_proj, &l.f_a_proj},
                      {&k.f_b_proj, &l.f_b_proj},
                      {&k.b_proj, &l.b_proj},
                      {&k.g_proj, &l.g_proj},
                      {&k.g_a_proj, &l.g_a_proj},
                      {&k.g_b_proj, &l.g_b_proj},
                      {&k.o_proj, &l.o_proj}}) {
    ExpectSame(*x, *y, p + "kda matrix");
  }
  for (auto [x, y] : {std::pair{&k.q_conv, &l.q_conv},
                      {&k.k_conv, &l.k_conv},
                      {&k.v_conv, &l.v_conv},
                      {&k.dt_bias, &l.dt_bias},
                      {&k.a_log, &l.a_log},
                      {&k.o_norm, &l.o_norm}}) {
    ExpectSame(*x, *y, p + "kda vector");
  }
  const MlaWeights &m = a.mla, &n = b.mla;
  for (auto [x, y] : {std::pair{&m.q_a_proj, &n.q_a_proj},
                      {&m.q_b_proj, &n.q_b_proj},
                      {&m.q_proj, &n.q_proj},
                      {&m.kv_a_proj_with_mqa, &n.kv_a_proj_with_mqa},
                      {&m.kv_b_proj, &n.kv_b_proj},
                      {&m.g_proj, &n.g_proj},
                      {&m.o_proj, &n.o_proj}}) {
    ExpectSame(*x, *y, p + "mla matrix");
  }
  ExpectSame(m.q_a_layernorm, n.q_a_layernorm, p + "q_a_layernorm");
  ExpectSame(m.kv_a_layernorm, n.kv_a_layernorm, p + "kv_a_layernorm");
  ExpectSame(a.dense_mlp, b.dense_mlp, p + "dense");
  ExpectSame(a.moe.shared, b.moe.shared, p + "shared");
  ExpectSame(a.moe.latent_up, b.moe.latent_up, p + "latent_up");
  ExpectSame(a.moe.router.gate, b.moe.router.gate, p + "gate");
  ExpectSame(a.moe.router.latent_down, b.moe.router.latent_down, p + "latent_down");
  ExpectSame(a.moe.router.score_bias, b.moe.router.score_bias, p + "score_bias");
  ExpectSame(a.moe.router.latent_norm, b.moe.router.latent_norm, p + "latent_norm");
  ASSERT_EQ(a.moe.experts.size(), b.moe.experts.size()) << p;
  for (size_t e = 0; e < a.moe.experts.size(); ++e) {
    ExpectSame(a.moe.experts[e], b.moe.experts[e], p + "expert " + std::to_string(e));
  }
}

TEST(SyntheticWeightsTest, SameTensorsAsLoadWeights) {
  auto config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/synthetic_reference";
  RandomCheckpointOptions options;
  options.mxfp4 = true;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, 3, dir, options).ok());
  auto loaded = LoadWeights(dir, WeightSelection::All());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ModelWeights& want = **loaded;

  const SyntheticModel model = MakeSyntheticWeights(want.config, 5);
  const ModelWeights& got = *model.weights;
  ExpectSame(got.embed_tokens, want.embed_tokens, "embed_tokens");
  ExpectSame(got.lm_head, want.lm_head, "lm_head");
  ExpectSame(got.final_norm, want.final_norm, "final_norm");
  ExpectSame(got.output_attn_res_norm, want.output_attn_res_norm, "output_attn_res_norm");
  ExpectSame(got.output_attn_res_proj, want.output_attn_res_proj, "output_attn_res_proj");
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (size_t l = 0; l < got.layers.size(); ++l) {
    ExpectSameLayer(got.layers[l], want.layers[l], "layer " + std::to_string(l) + " ");
  }
}

TEST(SyntheticWeightsTest, ValuesHaveTheIntendedScale) {
  auto config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  const SyntheticModel model = MakeSyntheticWeights(*config, 5);
  const WeightMatrix& w = model.weights->layers[0].kda.q_proj;
  double sum2 = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) sum2 += w.At(r, c) * w.At(r, c);
  }
  EXPECT_NEAR(std::sqrt(sum2 / (w.rows * w.cols)), 0.02, 0.002);
  // Routed experts: E2M1 codes (RMS about 2.9) times 2^-8..2^-6.
  const WeightMatrix& e = model.weights->layers[1].moe.experts[3].down;
  sum2 = 0;
  for (int64_t r = 0; r < e.rows; ++r) {
    for (int64_t c = 0; c < e.cols; ++c) sum2 += e.At(r, c) * e.At(r, c);
  }
  EXPECT_NEAR(std::sqrt(sum2 / (e.rows * e.cols)), 0.025, 0.008);
  // Two matrices of the same shape start at different places of the pool.
  EXPECT_NE(w.data, model.weights->layers[0].kda.k_proj.data);
}

int64_t Count(const WeightMatrix& m) { return m.empty() ? 0 : m.rows * m.cols; }
int64_t Count(const GatedMlpWeights& w) { return Count(w.gate) + Count(w.up) + Count(w.down); }

// k3-slice, as gpu_step_bench builds it: quickly, in about 1 GB of host memory, and with every
// non-expert parameter the spec counts (step_bytes.h's NonExpertParameters, from the checkpoint
// layout) present once.
TEST(SyntheticWeightsTest, K3SliceHasTheSpecsParameters) {
  auto config = NamedConfig("k3-slice");
  ASSERT_TRUE(config.ok()) << config.status();
  const auto start = std::chrono::steady_clock::now();
  const SyntheticModel model = MakeSyntheticWeights(*config, 1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);
  const size_t host_bytes = 2 * (model.linear_pool.size() + model.embedding_pool.size()) +
                            model.codes_pool.size() + model.scales_pool.size();
  EXPECT_LT(host_bytes, size_t{1} << 30);
  const ModelWeights& w = *model.weights;
  int64_t params = Count(w.embed_tokens) + Count(w.lm_head) + w.final_norm.size() +
                   w.output_attn_res_norm.size() + w.output_attn_res_proj.size();
  int64_t expert_values = 0;
  for (const LayerWeights& l : w.layers) {
    params += l.input_layernorm.size() + l.post_attention_layernorm.size() +
              l.attn_res_norm.size() + l.attn_res_proj.size() + l.mlp_res_norm.size() +
              l.mlp_res_proj.size();
    const KdaWeights& k = l.kda;
    for (const WeightMatrix* m : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a_proj, &k.f_b_proj,
                                  &k.b_proj, &k.g_proj, &k.g_a_proj, &k.g_b_proj, &k.o_proj}) {
      params += Count(*m);
    }
    params += k.q_conv.size() + k.k_conv.size() + k.v_conv.size() + k.dt_bias.size() +
              k.a_log.size() + k.o_norm.size();
    const MlaWeights& m = l.mla;
    for (const WeightMatrix* x : {&m.q_a_proj, &m.q_b_proj, &m.q_proj, &m.kv_a_proj_with_mqa,
                                  &m.kv_b_proj, &m.g_proj, &m.o_proj}) {
      params += Count(*x);
    }
    params += m.q_a_layernorm.size() + m.kv_a_layernorm.size();
    params += Count(l.dense_mlp) + Count(l.moe.shared) + Count(l.moe.latent_up) +
              Count(l.moe.router.gate) + Count(l.moe.router.latent_down) +
              l.moe.router.score_bias.size() + l.moe.router.latent_norm.size();
    for (const GatedMlpWeights& e : l.moe.experts) expert_values += Count(e);
  }
  EXPECT_EQ(params, NonExpertParameters(*config));
  // 64 experts x 3 MoE layers of 3 x 3072 x 3584 (spec §12.7: 6.3B routed-expert params).
  EXPECT_EQ(expert_values, int64_t{64} * 3 * 3 * 3072 * 3584);
}

}  // namespace
}  // namespace k3
