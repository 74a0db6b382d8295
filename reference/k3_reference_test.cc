#include "reference/k3_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "model/safetensors.h"
#include "reference/half_bits.h"

namespace k3::reference {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  Vec Normal(size_t n, double stddev, double mean = 0.0) {
    std::normal_distribution<double> dist(mean, stddev);
    Vec v(n);
    for (double& x : v) x = dist(gen_);
    return v;
  }
  Matrix Mat(int64_t rows, int64_t cols, double stddev) {
    return Matrix{rows, cols, Normal(static_cast<size_t>(rows * cols), stddev)};
  }
  Rows Seq(size_t steps, size_t width, double stddev) {
    Rows r;
    for (size_t t = 0; t < steps; ++t) r.push_back(Normal(width, stddev));
    return r;
  }

 private:
  std::mt19937_64 gen_;
};

double MaxAbsDiff(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

double MaxAbs(const Vec& a) {
  double m = 0.0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Block AttnRes layer flow (spec §4.2) with stand-in sublayers whose outputs ignore their input.

// Each stand-in sublayer returns a fixed vector per layer and records the input it was given.
struct FakeSublayers {
  std::vector<Vec> attn_out, ffn_out;  // per layer
  std::vector<Vec> attn_in, ffn_in;    // recorded, position 0
};

AttnResQueries ZeroQueries(int layers, size_t d, Rng& rng) {
  AttnResQueries q;
  for (int l = 0; l < layers; ++l) {
    q.mixer.push_back({Vec(d, 0.0), rng.Normal(d, 0.1, 1.0)});
    q.ffn.push_back({Vec(d, 0.0), rng.Normal(d, 0.1, 1.0)});
  }
  q.output = {Vec(d, 0.0), rng.Normal(d, 0.1, 1.0)};
  return q;
}

Vec Mean(const std::vector<Vec>& vs) {
  Vec m(vs[0].size(), 0.0);
  for (const Vec& v : vs) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += v[i] / static_cast<double>(vs.size());
  }
  return m;
}

Vec Sum(const std::vector<Vec>& vs) {
  Vec m(vs[0].size(), 0.0);
  for (const Vec& v : vs) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += v[i];
  }
  return m;
}

absl::StatusOr<Rows> RunFakeStack(int layers, int block_size, const Vec& embedding,
                                  FakeSublayers& fake, Rng& rng) {
  const size_t d = embedding.size();
  for (int l = 0; l < layers; ++l) {
    fake.attn_out.push_back(rng.Normal(d, 1.0));
    fake.ffn_out.push_back(rng.Normal(d, 1.0));
  }
  Sublayer mixer = [&fake](int l, const Rows& h) -> absl::StatusOr<Rows> {
    fake.attn_in.push_back(h[0]);
    return Rows{fake.attn_out[l]};
  };
  Sublayer ffn = [&fake](int l, const Rows& h) -> absl::StatusOr<Rows> {
    fake.ffn_in.push_back(h[0]);
    return Rows{fake.ffn_out[l]};
  };
  return AttnResStack({embedding}, block_size, ZeroQueries(layers, d, rng), 1e-5, mixer, ffn);
}

// §12.4 identity 5 and the boundary rules of §4.2 on k3-tiny's shape (L = 9, B = 4): with zero
// queries every read is the plain mean of its sources, so each read reveals its source set.
TEST(AttnResStackTest, ZeroQueriesExposeTheSourceSets) {
  Rng rng(1);
  const Vec e = rng.Normal(6, 1.0);
  FakeSublayers f;
  absl::StatusOr<Rows> out = RunFakeStack(9, 4, e, f, rng);
  ASSERT_TRUE(out.ok()) << out.status();
  auto layer = [&f](int l) { return Sum({f.attn_out[l], f.ffn_out[l]}); };
  const Vec b1 = Sum({layer(0), layer(1), layer(2), layer(3)});
  const Vec b2 = Sum({layer(4), layer(5), layer(6), layer(7)});
  const Vec b3 = layer(8);  // the partial last block
  const double tol = 1e-12;

  EXPECT_LT(MaxAbsDiff(f.attn_in[0], e), tol);                        // layer 0: read skipped
  EXPECT_LT(MaxAbsDiff(f.ffn_in[0], Mean({e, f.attn_out[0]})), tol);  // the embedding is b_0
  EXPECT_LT(MaxAbsDiff(f.attn_in[1], Mean({e, layer(0)})), tol);
  EXPECT_LT(MaxAbsDiff(f.ffn_in[1], Mean({e, Sum({layer(0), f.attn_out[1]})})), tol);
  // Boundary layer 4: the attention read sees the completed block as the partial sum, no empty
  // partial; the FFN read sees [b_0, b_1, attn_4].
  EXPECT_LT(MaxAbsDiff(f.attn_in[4], Mean({e, b1})), tol);
  EXPECT_LT(MaxAbsDiff(f.ffn_in[4], Mean({e, b1, f.attn_out[4]})), tol);
  EXPECT_LT(MaxAbsDiff(f.attn_in[5], Mean({e, b1, layer(4)})), tol);
  EXPECT_LT(MaxAbsDiff(f.attn_in[8], Mean({e, b1, b2})), tol);
  EXPECT_LT(MaxAbsDiff(f.ffn_in[8], Mean({e, b1, b2, f.attn_out[8]})), tol);
  // Output: ceil(9/4) + 1 = 4 sources.
  EXPECT_LT(MaxAbsDiff((*out)[0], Mean({e, b1, b2, b3})), tol);
}

TEST(AttnResStackTest, CompleteLastBlockGivesThreeOutputSources) {
  Rng rng(2);
  const Vec e = rng.Normal(5, 1.0);
  FakeSublayers f;
  absl::StatusOr<Rows> out = RunFakeStack(8, 4, e, f, rng);  // k3-tiny-8: ceil(8/4) + 1 = 3
  ASSERT_TRUE(out.ok()) << out.status();
  Vec b1(5, 0.0), b2(5, 0.0);
  for (int l = 0; l < 8; ++l) {
    Vec& b = l < 4 ? b1 : b2;
    for (int i = 0; i < 5; ++i) b[i] += f.attn_out[l][i] + f.ffn_out[l][i];
  }
  EXPECT_LT(MaxAbsDiff((*out)[0], Mean({e, b1, b2})), 1e-12);
}

TEST(AttnResStackTest, SublayerErrorsPassThrough) {
  Rng rng(3);
  Sublayer ok = [](int, const Rows& h) -> absl::StatusOr<Rows> { return h; };
  Sublayer bad = [](int l, const Rows&) -> absl::StatusOr<Rows> {
    if (l == 2) return absl::NotFoundError("layer 2 missing");
    return Rows{Vec(3, 0.0)};
  };
  absl::StatusOr<Rows> out = AttnResStack({Vec(3, 1.0)}, 2, ZeroQueries(4, 3, rng), 1e-5, ok, bad);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// LatentMoE (spec §7.2).

ModelConfig TinyConfig(const char* name) {
  absl::StatusOr<ModelConfig> c = NamedConfig(name);
  CHECK(c.ok()) << c.status();
  return *c;
}

MoeParams RandomMoe(const ModelConfig& c, double stddev, Rng& rng) {
  const int64_t d = c.hidden_size, h = c.ExpertWidth(), f = c.moe_intermediate_size;
  MoeParams p;
  p.router = rng.Mat(c.num_experts, d, 0.1);
  p.score_bias = rng.Normal(c.num_experts, 0.05);
  if (c.IsLatentMoe()) {
    p.latent_down = rng.Mat(h, d, stddev);
    p.latent_norm = rng.Normal(h, 0.1, 1.0);
    p.latent_up = rng.Mat(d, h, stddev);
  }
  for (int e = 0; e < c.num_experts; ++e) {
    p.experts.push_back({rng.Mat(f, h, stddev), rng.Mat(f, h, stddev), rng.Mat(h, f, stddev)});
  }
  const int64_t s = c.SharedWidth();
  p.shared = GluMlpParams{rng.Mat(s, d, stddev), rng.Mat(s, d, stddev), rng.Mat(d, s, stddev)};
  return p;
}

// §12.4 identity 7: every routed expert's w2 scaled by c scales u by c, which the latent RMSNorm
// removes. Weights at std 0.2 keep mean(u²) far above eps.
TEST(MoeTest, LatentNormRemovesTheScaleOfU) {
  const ModelConfig c = TinyConfig("k3-tiny");
  Rng rng(4);
  MoeParams p = RandomMoe(c, 0.2, rng);
  const Vec x = rng.Normal(c.hidden_size, 1.0);
  const Vec y = MoeForward(p, c, x);
  MoeParams scaled = p;
  for (GluMlpParams& e : scaled.experts) {
    for (double& w : e.down.data) w *= 7.0;
  }
  const Vec y7 = MoeForward(scaled, c, x);
  // Only eps = 1e-5 against mean(u²) (here far above 1) separates the two.
  EXPECT_LT(MaxAbsDiff(y, y7), 1e-6 * MaxAbs(y));
  ModelConfig no_eps = c;
  no_eps.rms_norm_eps = 0.0f;
  EXPECT_LT(MaxAbsDiff(MoeForward(p, no_eps, x), MoeForward(scaled, no_eps, x)), 1e-12 * MaxAbs(y));

  // Without the norm the routed part scales by c exactly (linearity), so the scaling above did
  // reach u; the shared experts are the unchanged remainder.
  p.latent_norm.clear();
  scaled.latent_norm.clear();
  const Vec shared = GluMlp(*p.shared, c, x);
  const Vec r1 = MoeForward(p, c, x);
  const Vec r7 = MoeForward(scaled, c, x);
  double routed_max = 0.0;
  for (size_t i = 0; i < r1.size(); ++i) {
    routed_max = std::max(routed_max, std::abs(r1[i] - shared[i]));
    EXPECT_NEAR(r7[i] - shared[i], 7.0 * (r1[i] - shared[i]), 1e-9 * MaxAbs(r7)) << i;
  }
  EXPECT_GT(routed_max, 1e-3);
}

// §7.2 written out a second way for one token: the top-k by s + bias, weights from the raw s.
TEST(MoeTest, MatchesAnExplicitSumOverTheChosenExperts) {
  ModelConfig c = TinyConfig("k3-tiny");
  c.routed_scaling_factor = 1.5;
  Rng rng(5);
  MoeParams p = RandomMoe(c, 0.2, rng);
  p.latent_norm.clear();  // so that the scaling factor shows
  const Vec x = rng.Normal(c.hidden_size, 1.0);

  Vec s = p.router.Apply(x);
  std::vector<std::pair<double, int>> by_choice;
  for (int e = 0; e < c.num_experts; ++e) {
    s[e] = 1 / (1 + std::exp(-s[e]));
    by_choice.push_back({-(s[e] + p.score_bias[e]), e});
  }
  std::sort(by_choice.begin(), by_choice.end());
  double total = 0.0;
  for (int j = 0; j < c.num_experts_per_token; ++j) total += s[by_choice[j].second];
  const Vec z = p.latent_down.Apply(x);
  Vec u(z.size(), 0.0);
  for (int j = 0; j < c.num_experts_per_token; ++j) {
    const int e = by_choice[j].second;
    const Vec out = GluMlp(p.experts[e], c, z);
    for (size_t i = 0; i < u.size(); ++i) u[i] += 1.5 * s[e] / total * out[i];
  }
  Vec expected = p.latent_up.Apply(u);
  const Vec shared = GluMlp(*p.shared, c, x);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += shared[i];
  EXPECT_LT(MaxAbsDiff(MoeForward(p, c, x), expected), 1e-12 * MaxAbs(expected));
}

// ---------------------------------------------------------------------------------------------
// KDA (spec §5) on one token: from a zero state S = β k̂ vᵀ, so o = β (k̂·q̂) v whatever the decay;
// the conv sees only its last tap. Both output-gate forms.

KdaParams RandomKda(const ModelConfig& c, Rng& rng) {
  const int64_t d = c.hidden_size, dim = c.linear_attn.head_dim;
  const int64_t heads = c.linear_attn.num_heads, width = heads * dim;
  const int64_t kernel = c.linear_attn.short_conv_kernel_size;
  KdaParams p;
  p.q_proj = rng.Mat(width, d, 0.3);
  p.k_proj = rng.Mat(width, d, 0.3);
  p.v_proj = rng.Mat(width, d, 0.3);
  p.q_conv = rng.Mat(width, kernel, 0.5);
  p.k_conv = rng.Mat(width, kernel, 0.5);
  p.v_conv = rng.Mat(width, kernel, 0.5);
  p.f_a_proj = rng.Mat(dim, d, 0.3);
  p.f_b_proj = rng.Mat(width, dim, 0.3);
  p.dt_bias = rng.Normal(width, 0.5);
  p.a_log = rng.Normal(heads, 0.5, 1.0);
  p.b_proj = rng.Mat(heads, d, 0.3);
  if (c.linear_attn.use_full_rank_gate) {
    p.g_proj = rng.Mat(width, d, 0.3);
  } else {
    p.g_a_proj = rng.Mat(dim, d, 0.3);
    p.g_b_proj = rng.Mat(width, dim, 0.3);
  }
  p.o_norm = rng.Normal(dim, 0.1, 1.0);
  p.o_proj = rng.Mat(d, width, 0.3);
  return p;
}

TEST(KdaTest, OneTokenByHand) {
  for (const char* name : {"k3-tiny", "kimi-linear-tiny"}) {
    const ModelConfig c = TinyConfig(name);
    const int heads = c.linear_attn.num_heads, dim = c.linear_attn.head_dim;
    const int kernel = c.linear_attn.short_conv_kernel_size;
    Rng rng(7);
    const KdaParams p = RandomKda(c, rng);
    const Vec x = rng.Normal(c.hidden_size, 1.0);
    auto conv_last_tap = [&](const Matrix& proj, const Matrix& conv) {
      Vec y = proj.Apply(x);
      for (size_t i = 0; i < y.size(); ++i) y[i] = Silu(conv.At(i, kernel - 1) * y[i]);
      return y;
    };
    const Vec q = conv_last_tap(p.q_proj, p.q_conv);
    const Vec k = conv_last_tap(p.k_proj, p.k_conv);
    const Vec v = conv_last_tap(p.v_proj, p.v_conv);
    const Vec b = p.b_proj.Apply(x);
    const Vec gate = c.linear_attn.use_full_rank_gate ? p.g_proj.Apply(x)
                                                      : p.g_b_proj.Apply(p.g_a_proj.Apply(x));
    Vec y(heads * dim);
    for (int h = 0; h < heads; ++h) {
      double qq = 0, kk = 0, qk = 0;
      for (int j = 0; j < dim; ++j) {
        qq += q[h * dim + j] * q[h * dim + j];
        kk += k[h * dim + j] * k[h * dim + j];
        qk += q[h * dim + j] * k[h * dim + j];
      }
      const double coef = Sigmoid(b[h]) * qk / std::sqrt((qq + 1e-6) * (kk + 1e-6) * dim);
      Vec o(dim);
      for (int j = 0; j < dim; ++j) o[j] = coef * v[h * dim + j];
      const Vec normed = RmsNorm(o, p.o_norm, c.rms_norm_eps);
      for (int j = 0; j < dim; ++j) y[h * dim + j] = normed[j] * Sigmoid(gate[h * dim + j]);
    }
    const Vec expected = p.o_proj.Apply(y);
    const Rows out = KdaForward(p, c, {x});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_LT(MaxAbsDiff(out[0], expected), 1e-12 * MaxAbs(expected)) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// MLA (spec §6): the expanded form against the absorbed form of §6.2 computed here.

TEST(MlaTest, ExpandedEqualsAbsorbed) {
  ModelConfig c = TinyConfig("k3-tiny");
  c.hidden_size = 12;
  c.num_attention_heads = 3;
  c.q_lora_rank = 7;
  c.kv_lora_rank = 5;
  c.qk_nope_head_dim = 4;
  c.qk_rope_head_dim = 2;
  c.v_head_dim = 3;
  const int d = 12, heads = 3, n = 4, r = 2, v = 3, lat = 5, ql = 7;
  Rng rng(6);
  MlaParams p;
  p.q_a_proj = rng.Mat(ql, d, 0.5);
  p.q_a_layernorm = rng.Normal(ql, 0.1, 1.0);
  p.q_b_proj = rng.Mat(heads * (n + r), ql, 0.5);
  p.kv_a_proj = rng.Mat(lat + r, d, 0.5);
  p.kv_a_layernorm = rng.Normal(lat, 0.1, 1.0);
  p.kv_b_proj = rng.Mat(heads * (n + v), lat, 0.5);
  p.g_proj = rng.Mat(heads * v, d, 0.5);
  p.o_proj = rng.Mat(d, heads * v, 0.5);
  const Rows x = rng.Seq(5, d, 1.0);
  const Rows expanded = MlaForward(p, c, x);

  // Absorbed: cache c_j (normalized latent) and k_pe_j; q̃_h = W_K[h]ᵀ q_nope_h; O_h = W_V[h] õ_h.
  Rows cache_c, cache_pe, q;
  for (const Vec& row : x) {
    q.push_back(p.q_b_proj.Apply(RmsNorm(p.q_a_proj.Apply(row), p.q_a_layernorm, 1e-6)));
    Vec ckv = p.kv_a_proj.Apply(row);
    cache_c.push_back(RmsNorm(Vec(ckv.begin(), ckv.begin() + lat), p.kv_a_layernorm, 1e-6));
    cache_pe.push_back(Vec(ckv.begin() + lat, ckv.end()));
  }
  for (size_t t = 0; t < x.size(); ++t) {
    Vec o(heads * v, 0.0);
    for (int h = 0; h < heads; ++h) {
      Vec q_tilde(lat, 0.0);
      for (int k = 0; k < lat; ++k) {
        for (int i = 0; i < n; ++i) {
          q_tilde[k] += p.kv_b_proj.At(h * (n + v) + i, k) * q[t][h * (n + r) + i];
        }
      }
      std::vector<double> w(t + 1);
      double total = 0.0;
      for (size_t j = 0; j <= t; ++j) {
        double score = 0.0;
        for (int k = 0; k < lat; ++k) score += q_tilde[k] * cache_c[j][k];
        for (int i = 0; i < r; ++i) score += q[t][h * (n + r) + n + i] * cache_pe[j][i];
        w[j] = std::exp(score / std::sqrt(6.0));
        total += w[j];
      }
      Vec o_lat(lat, 0.0);
      for (size_t j = 0; j <= t; ++j) {
        for (int k = 0; k < lat; ++k) o_lat[k] += w[j] / total * cache_c[j][k];
      }
      for (int i = 0; i < v; ++i) {
        for (int k = 0; k < lat; ++k)
          o[h * v + i] += p.kv_b_proj.At(h * (n + v) + n + i, k) * o_lat[k];
      }
    }
    const Vec gate = p.g_proj.Apply(x[t]);
    for (size_t i = 0; i < o.size(); ++i) o[i] /= 1 + std::exp(-gate[i]);
    const Vec expected = p.o_proj.Apply(o);
    EXPECT_LT(MaxAbsDiff(expanded[t], expected), 1e-12 * MaxAbs(expected)) << "t=" << t;
  }
}

// ---------------------------------------------------------------------------------------------
// The whole model on random tiny checkpoints (spec §12).

class ReferenceModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  static std::string WriteCheckpoint(const std::string& config_name, uint64_t seed) {
    const std::string dir =
        std::string(std::getenv("TEST_TMPDIR")) + "/" + config_name + "_" + std::to_string(seed);
    absl::Status s = WriteRandomCheckpoint(TinyConfig(config_name.c_str()), seed, dir, 2);
    EXPECT_TRUE(s.ok()) << s;
    return dir;
  }
};

std::unique_ptr<Checkpoint> OpenOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  CHECK(ckpt.ok()) << ckpt.status();
  return *std::move(ckpt);
}

// Causality holds for the whole model: a prefix's logits are the first rows of a longer run.
TEST_P(ReferenceModelTest, PrefixLogitsAreTheFirstRowsAndFinite) {
  std::unique_ptr<Checkpoint> ckpt = OpenOrDie(WriteCheckpoint(GetParam(), 11));
  const int64_t vocab = ckpt->config().vocab_size;
  const std::vector<int32_t> tokens = {3, 141, 59, 265, 35, 89, 79, 3};
  absl::StatusOr<std::vector<double>> full = ReferenceLogits(*ckpt, tokens);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->size(), tokens.size() * vocab);
  for (double x : *full) ASSERT_TRUE(std::isfinite(x));

  const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + 5);
  absl::StatusOr<std::vector<double>> part = ReferenceLogits(*ckpt, prefix);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_EQ(part->size(), prefix.size() * vocab);
  const Vec head(full->begin(), full->begin() + part->size());
  EXPECT_LT(MaxAbsDiff(*part, head), 1e-10 * MaxAbs(head));

  // The same token at positions 0 and 7 sees different contexts; position 0 at least differs.
  const Vec first(full->begin(), full->begin() + vocab);
  const Vec last(full->end() - vocab, full->end());
  EXPECT_GT(MaxAbsDiff(first, last), 1e-3 * MaxAbs(first));
  for (size_t t = 1; t < tokens.size(); ++t) {
    const Vec row(full->begin() + t * vocab, full->begin() + (t + 1) * vocab);
    const Vec prev(full->begin() + (t - 1) * vocab, full->begin() + t * vocab);
    EXPECT_GT(MaxAbsDiff(row, prev), 0.0) << t;
  }
}

TEST_P(ReferenceModelTest, RejectsBadTokens) {
  std::unique_ptr<Checkpoint> ckpt = OpenOrDie(WriteCheckpoint(GetParam(), 12));
  EXPECT_EQ(ReferenceLogits(*ckpt, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReferenceLogits(*ckpt, {1, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  const int32_t vocab = static_cast<int32_t>(ckpt->config().vocab_size);
  EXPECT_EQ(ReferenceLogits(*ckpt, {vocab}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Copies a checkpoint into one model.safetensors, letting `edit` change each tensor.
using Edit = std::function<void(TensorToWrite&)>;
std::string CopyCheckpoint(const std::string& src, const std::string& dst, const Edit& edit) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  fs::copy_file(src + "/config.json", dst + "/config.json", fs::copy_options::overwrite_existing);
  std::vector<TensorToWrite> tensors;
  for (const fs::directory_entry& entry : fs::directory_iterator(src)) {
    if (entry.path().extension() != ".safetensors") continue;
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(entry.path());
    CHECK(file.ok()) << file.status();
    for (const auto& [name, info] : (*file)->tensors()) {
      absl::StatusOr<TensorView> view = (*file)->Get(name);
      CHECK(view.ok()) << view.status();
      TensorToWrite t{name, view->dtype, view->shape,
                      std::string(reinterpret_cast<const char*>(view->data), view->bytes)};
      edit(t);
      tensors.push_back(std::move(t));
    }
  }
  absl::Status s = WriteSafetensors(dst + "/model.safetensors", tensors);
  CHECK(s.ok()) << s;
  return dst;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<float> AsFloats(const TensorToWrite& t) {
  const size_t n = t.bytes.size() / DTypeSize(t.dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], t.bytes.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
      CHECK(t.dtype == DType::kBf16) << t.name;
      out[i] = static_cast<float>(Bf16ToDouble(bits));  // exact: a bf16 is a float
    }
  }
  return out;
}

void SetFloats(TensorToWrite& t, const std::vector<float>& values) {
  t.dtype = DType::kF32;
  t.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::vector<double> LogitsOrDie(const std::string& dir, const std::vector<int32_t>& tokens) {
  absl::StatusOr<std::vector<double>> logits = ReferenceLogits(*OpenOrDie(dir), tokens);
  CHECK(logits.ok()) << logits.status();
  return *std::move(logits);
}

absl::Status LogitsStatus(const std::string& dir) {
  return ReferenceLogits(*OpenOrDie(dir), {1, 2, 3}).status();
}

// Storage choices the spec allows (F32 instead of BF16, conv [C, K] instead of [C, 1, K], A_log
// padded with zeros, §10-§11) leave the logits bit-identical; the selection bias does not (§7.2).
TEST_P(ReferenceModelTest, StorageVariantsAgreeAndTheBiasMatters) {
  const std::string src = WriteCheckpoint(GetParam(), 13);
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::vector<int32_t> tokens = {7, 300, 12, 511, 64, 2};
  const std::vector<double> base = LogitsOrDie(src, tokens);

  const std::string variant = CopyCheckpoint(src, tmp + "/variant", [](TensorToWrite& t) {
    if (t.dtype == DType::kBf16) SetFloats(t, AsFloats(t));
    if (t.shape.size() == 3 && t.shape[1] == 1) t.shape = {t.shape[0], t.shape[2]};
    if (EndsWith(t.name, "A_log")) {
      std::vector<float> v = AsFloats(t);
      v.resize(v.size() + 4, 0.0f);
      t.shape = {static_cast<int64_t>(v.size())};
      SetFloats(t, v);
    }
  });
  EXPECT_EQ(LogitsOrDie(variant, tokens), base);

  const std::string unbiased = CopyCheckpoint(src, tmp + "/unbiased", [](TensorToWrite& t) {
    if (EndsWith(t.name, "e_score_correction_bias")) {
      SetFloats(t, std::vector<float>(AsFloats(t).size(), 0.0f));
    }
  });
  EXPECT_GT(MaxAbsDiff(LogitsOrDie(unbiased, tokens), base), 1e-6 * MaxAbs(base));
}

TEST_P(ReferenceModelTest, BadTensorsAreNamed) {
  const std::string src = WriteCheckpoint(GetParam(), 14);
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string padded = CopyCheckpoint(src, tmp + "/bad_alog", [](TensorToWrite& t) {
    if (EndsWith(t.name, "layers.1.self_attn.A_log")) {
      std::vector<float> v = AsFloats(t);
      v.push_back(0.5f);
      t.shape = {static_cast<int64_t>(v.size())};
      SetFloats(t, v);
    }
  });
  absl::Status s = LogitsStatus(padded);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers.1.self_attn.A_log"), absl::string_view::npos) << s;

  const std::string reshaped = CopyCheckpoint(src, tmp + "/bad_shape", [](TensorToWrite& t) {
    if (EndsWith(t.name, "layers.3.self_attn.kv_b_proj.weight")) {
      t.shape = {t.shape[1], t.shape[0]};
    }
  });
  s = LogitsStatus(reshaped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers.3.self_attn.kv_b_proj.weight"), absl::string_view::npos) << s;

  const std::string integer = CopyCheckpoint(src, tmp + "/bad_dtype", [](TensorToWrite& t) {
    if (EndsWith(t.name, "model.norm.weight")) {
      t.dtype = DType::kI32;
      t.bytes = std::string(t.shape[0] * 4, '\0');
    }
  });
  s = LogitsStatus(integer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.norm.weight"), absl::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(TinyConfigs, ReferenceModelTest,
                         ::testing::Values("k3-tiny", "kimi-linear-tiny"));

}  // namespace
}  // namespace k3::reference
