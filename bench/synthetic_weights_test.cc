// MakeSyntheticWeights gives every tensor LoadWeights gives for the same config, with the same
// shape and dtype (compared field by field with a random MXFP4 checkpoint of k3-tiny loaded by
// LoadWeights), and values of the intended scale.
#include "bench/synthetic_weights.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace k3
