#include "attention_nodes/forward/mla.h"

#include <cmath>
#include <vector>

#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using mixer_test::AllClose;
using mixer_test::RandomWeights;

// ---------------------------------------------------------------------------------------------
// fp64 reference: the expanded form of spec §6.1 over a whole sequence, causal.

std::vector<double> Apply(const WeightMatrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.rows, 0.0);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) y[r] += static_cast<double>(w.At(r, c)) * x[c];
  }
  return y;
}

std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<float>& gamma,
                            double eps) {
  double ms = 0;
  for (double v : x) ms += v * v / x.size();
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = gamma[i] * x[i] / std::sqrt(ms + eps);
  return y;
}

double Sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<double> RefMla(const ModelConfig& config, const MlaWeights& w,
                           const std::vector<float>& x_all) {
  const int h = config.num_attention_heads, d = config.hidden_size;
  const int n = config.qk_nope_head_dim, r = config.qk_rope_head_dim, vd = config.v_head_dim;
  const int c = config.kv_lora_rank, qhd = n + r;
  const int tokens = static_cast<int>(x_all.size()) / d;
  std::vector<std::vector<double>> q(tokens), kv(tokens), kpe(tokens), gate(tokens);
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> x(x_all.begin() + t * d, x_all.begin() + (t + 1) * d);
    q[t] = config.q_lora_rank
               ? Apply(w.q_b_proj, RmsNorm(Apply(w.q_a_proj, x), w.q_a_layernorm, 1e-6))
               : Apply(w.q_proj, x);
    std::vector<double> ckv = Apply(w.kv_a_proj_with_mqa, x);
    std::vector<double> latent(ckv.begin(), ckv.begin() + c);
    kpe[t].assign(ckv.begin() + c, ckv.end());
    kv[t] = Apply(w.kv_b_proj, RmsNorm(latent, w.kv_a_layernorm, 1e-6));
    if (config.mla_use_output_gate) gate[t] = Apply(w.g_proj, x);
  }
  std::vector<double> out;
  for (int i = 0; i < tokens; ++i) {
    std::vector<double> o(h * vd, 0.0);
    for (int head = 0; head < h; ++head) {
      std::vector<double> score(i + 1);
      double max = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        double s = 0;
        for (int m = 0; m < n; ++m) s += q[i][head * qhd + m] * kv[j][head * (n + vd) + m];
        for (int m = 0; m < r; ++m) s += q[i][head * qhd + n + m] * kpe[j][m];
        score[j] = s / std::sqrt(static_cast<double>(qhd));
        max = std::max(max, score[j]);
      }
      double sum = 0;
      for (double& s : score) sum += (s = std::exp(s - max));
      for (int j = 0; j <= i; ++j) {
        for (int m = 0; m < vd; ++m) {
          o[head * vd + m] += score[j] / sum * kv[j][head * (n + vd) + n + m];
        }
      }
    }
    if (config.mla_use_output_gate) {
      for (int m = 0; m < h * vd; ++m) o[m] *= Sigm(gate[i][m]);
    }
    std::vector<double> y = Apply(w.o_proj, o);
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

// k3-tiny's MLA dims (§12.1), optionally without q-LoRA and the output gate (Kimi Linear).
ModelConfig TinyConfig(bool k3) {
  ModelConfig config;
  config.hidden_size = 256;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 4;
  config.kv_lora_rank = 64;
  config.qk_nope_head_dim = 32;
  config.qk_rope_head_dim = 16;
  config.v_head_dim = 32;
  if (k3) {
    config.q_lora_rank = 64;
    config.mla_use_output_gate = true;
  } else {
    config.q_lora_rank.reset();
    config.mla_use_output_gate = false;
  }
  return config;
}

// Query and key weights larger than §12.3's 0.02 so that the softmax is far from uniform.
MlaWeights MakeWeights(const ModelConfig& config, RandomWeights* rnd) {
  const int h = config.num_attention_heads, d = config.hidden_size;
  const int qhd = config.MlaQHeadDim(), c = config.kv_lora_rank, r = config.qk_rope_head_dim;
  const int vd = config.v_head_dim;
  MlaWeights w;
  if (config.q_lora_rank) {
    w.q_a_proj = rnd->Matrix(*config.q_lora_rank, d, 0.1f);
    w.q_a_layernorm = rnd->Normal(*config.q_lora_rank, 1.0f, 0.1f);
    w.q_b_proj = rnd->Matrix(h * qhd, *config.q_lora_rank, 0.3f, WeightType::kF32);
  } else {
    w.q_proj = rnd->Matrix(h * qhd, d, 0.1f);
  }
  w.kv_a_proj_with_mqa = rnd->Matrix(c + r, d, 0.1f);
  w.kv_a_layernorm = rnd->Normal(c, 1.0f, 0.1f);
  w.kv_b_proj = rnd->Matrix(h * (config.qk_nope_head_dim + vd), c, 0.3f);
  if (config.mla_use_output_gate) w.g_proj = rnd->Matrix(h * vd, d, 0.05f);
  w.o_proj = rnd->Matrix(d, h * vd, 0.05f, WeightType::kF32);
  return w;
}

std::vector<float> Forward(const ModelConfig& config, const MlaWeights& w,
                           const std::vector<float>& x, MlaCache* cache, Scratch* scratch,
                           MlaForm form) {
  const int64_t tokens = static_cast<int64_t>(x.size()) / config.hidden_size;
  std::vector<float> out(x.size(), NAN);
  absl::Status status =
      MlaForwardBatch(config, w, x.data(), {{cache, tokens}}, out.data(), scratch, form);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<float> Slice(const std::vector<float>& x, int64_t first, int64_t count, int64_t d) {
  return std::vector<float>(x.begin() + first * d, x.begin() + (first + count) * d);
}

class MlaTest
    : public ::testing::TestWithParam<bool> {  // param: K3 (q-LoRA, gate), else Kimi Linear
 protected:
  ModelConfig Config() const { return TinyConfig(GetParam()); }
};

// 150 tokens: more than two blocks of keys for the running-maximum softmax.
TEST_P(MlaTest, PrefillBothFormsMatchReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(11);
  const MlaWeights w = MakeWeights(config, &rnd);
  const std::vector<float> x = rnd.Normal(150 * config.hidden_size, 0.0f, 1.0f);
  const std::vector<double> ref = RefMla(config, w, x);
  Scratch scratch;
  for (MlaForm form : {MlaForm::kAuto, MlaForm::kExpanded, MlaForm::kAbsorbed}) {
    MlaCache cache(config);
    EXPECT_TRUE(AllClose(Forward(config, w, x, &cache, &scratch, form), ref, 1e-4));
    EXPECT_EQ(cache.length, 150);
  }
}

TEST_P(MlaTest, PrefillThenDecodeMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(12);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size, prefill = 25, decode = 15;
  const std::vector<float> x = rnd.Normal((prefill + decode) * d, 0.0f, 1.0f);

  MlaCache cache(config);
  Scratch scratch;
  std::vector<float> out =
      Forward(config, w, Slice(x, 0, prefill, d), &cache, &scratch, MlaForm::kAuto);
  for (int64_t t = prefill; t < prefill + decode; ++t) {
    std::vector<float> step =
        Forward(config, w, Slice(x, t, 1, d), &cache, &scratch, MlaForm::kAuto);
    out.insert(out.end(), step.begin(), step.end());
  }
  EXPECT_EQ(cache.length, prefill + decode);
  EXPECT_TRUE(AllClose(out, RefMla(config, w, x), 1e-4));
}

// A long context: a decode step splits its keys across threads and merges the partial softmaxes.
TEST_P(MlaTest, DecodeOverLongContextMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(16);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size, prefill = 300, decode = 2;
  const std::vector<float> x = rnd.Normal((prefill + decode) * d, 0.0f, 1.0f);
  const std::vector<double> ref = RefMla(config, w, x);
  MlaCache cache(config);
  Scratch scratch;
  // 300 prefill tokens also span two query chunks of the expanded form.
  EXPECT_TRUE(
      AllClose(Forward(config, w, Slice(x, 0, prefill, d), &cache, &scratch, MlaForm::kAuto),
               std::vector<double>(ref.begin(), ref.begin() + prefill * d), 1e-4));
  for (int64_t t = prefill; t < prefill + decode; ++t) {
    EXPECT_TRUE(AllClose(Forward(config, w, Slice(x, t, 1, d), &cache, &scratch, MlaForm::kAuto),
                         std::vector<double>(ref.begin() + t * d, ref.begin() + (t + 1) * d),
                         1e-4));
  }
}

// Several new tokens appended to a non-empty cache, in each form.
TEST_P(MlaTest, AppendToNonEmptyCacheMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(13);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  const std::vector<float> x = rnd.Normal(90 * d, 0.0f, 1.0f);
  const std::vector<double> ref = RefMla(config, w, x);
  const std::vector<double> ref_tail(ref.begin() + 20 * d, ref.end());
  Scratch scratch;
  for (MlaForm form : {MlaForm::kAuto, MlaForm::kExpanded, MlaForm::kAbsorbed}) {
    MlaCache cache(config);
    Forward(config, w, Slice(x, 0, 20, d), &cache, &scratch, MlaForm::kAuto);
    EXPECT_TRUE(
        AllClose(Forward(config, w, Slice(x, 20, 70, d), &cache, &scratch, form), ref_tail, 1e-4));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MlaTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "K3QLoraGated" : "KimiLinearPlainQ";
                         });

// One batch mixing every case: a fresh prefill (expanded), decode steps on short and long caches
// (absorbed, one with key splits), several tokens on a warm cache, a first token alone, and an
// empty segment. Each sequence must get its own reference output.
TEST_P(MlaTest, BatchOfMixedSequencesMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(17);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  const std::vector<int64_t> history = {0, 30, 0, 300, 12, 0}, fresh = {40, 1, 0, 1, 5, 1};
  std::vector<MlaCache> caches;
  std::vector<std::vector<float>> inputs;
  Scratch scratch;
  for (size_t s = 0; s < history.size(); ++s) {
    inputs.push_back(rnd.Normal((history[s] + fresh[s]) * d, 0.0f, 1.0f));
    caches.emplace_back(config);
    if (history[s] > 0) {
      Forward(config, w, Slice(inputs[s], 0, history[s], d), &caches[s], &scratch, MlaForm::kAuto);
    }
  }
  std::vector<float> x;
  std::vector<MlaSegment> segments;
  for (size_t s = 0; s < history.size(); ++s) {
    const std::vector<float> rows = Slice(inputs[s], history[s], fresh[s], d);
    x.insert(x.end(), rows.begin(), rows.end());
    segments.push_back({&caches[s], fresh[s]});
  }
  std::vector<float> out(x.size(), NAN);
  ASSERT_TRUE(MlaForwardBatch(config, w, x.data(), segments, out.data(), &scratch).ok());
  int64_t row = 0;
  for (size_t s = 0; s < history.size(); ++s) {
    EXPECT_EQ(caches[s].length, history[s] + fresh[s]);
    if (fresh[s] == 0) continue;
    const std::vector<double> ref = RefMla(config, w, inputs[s]);
    EXPECT_TRUE(AllClose(Slice(out, row, fresh[s], d),
                         std::vector<double>(ref.begin() + history[s] * d, ref.end()), 1e-4))
        << "sequence " << s;
    row += fresh[s];
  }
}

TEST(MlaCacheTest, RowsHoldNormalizedLatentAndRawKeyBypass) {
  const ModelConfig config = TinyConfig(true);
  RandomWeights rnd(14);
  const MlaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size, c = config.kv_lora_rank;
  // Small inputs make mean(c²) comparable to the latent norms' ε, so using rms_norm_eps (1e-5)
  // instead of 1e-6 there would show.
  const std::vector<float> x = rnd.Normal(3 * d, 0.0f, 0.003f);
  MlaCache cache(config);
  EXPECT_EQ(cache.width(), 80);
  cache.Reserve(2);  // too small on purpose: the call must grow it
  Scratch scratch;
  EXPECT_TRUE(AllClose(Forward(config, w, x, &cache, &scratch, MlaForm::kAuto),
                       RefMla(config, w, x), 1e-4));
  ASSERT_EQ(cache.length, 3);
  EXPECT_GE(cache.ByteSize(), 3 * 80 * sizeof(float));
  for (int t = 0; t < 3; ++t) {
    std::vector<double> xt(x.begin() + t * d, x.begin() + (t + 1) * d);
    std::vector<double> ckv = Apply(w.kv_a_proj_with_mqa, xt);
    std::vector<double> expected =
        RmsNorm(std::vector<double>(ckv.begin(), ckv.begin() + c), w.kv_a_layernorm, 1e-6);
    expected.insert(expected.end(), ckv.begin() + c, ckv.end());
    EXPECT_TRUE(AllClose(std::vector<float>(cache.Row(t), cache.Row(t) + 80), expected, 1e-5));
  }
  cache.Clear();
  EXPECT_EQ(cache.length, 0);
}

TEST(MlaValidationTest, RejectsMismatchedCacheAndWeights) {
  const ModelConfig config = TinyConfig(true);
  RandomWeights rnd(15);
  MlaWeights w = MakeWeights(config, &rnd);
  std::vector<float> x(config.hidden_size, 1.0f), out(config.hidden_size, 0.0f);
  Scratch scratch;

  ModelConfig other = config;
  other.kv_lora_rank = 32;
  MlaCache wrong(other);
  absl::Status status = MlaForwardBatch(config, w, x.data(), {{&wrong, 1}}, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("cache"), std::string::npos) << status;

  MlaCache cache(config);
  w.q_b_proj.rows -= 1;
  status = MlaForwardBatch(config, w, x.data(), {{&cache, 1}}, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("q_b_proj"), std::string::npos) << status;
  EXPECT_EQ(cache.length, 0);
}

}  // namespace
}  // namespace k3
