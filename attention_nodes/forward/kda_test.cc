#include "attention_nodes/forward/kda.h"

#include <cmath>
#include <vector>

#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using mixer_test::AllClose;
using mixer_test::RandomWeights;

// ---------------------------------------------------------------------------------------------
// fp64 reference, written from spec §3.3, §3.4 and §5 with no shortcut: one token at a time.

struct RefState {
  std::vector<std::vector<double>> conv[3];  // per q/k/v: the last window pre-conv rows [P]
  std::vector<double> s;                     // [H, K, V]
};

RefState NewRefState(const ModelConfig& config) {
  const int p = config.KdaWidth(), k = config.linear_attn.head_dim;
  RefState st;
  for (auto& conv : st.conv) {
    conv.assign(config.linear_attn.short_conv_kernel_size - 1, std::vector<double>(p, 0.0));
  }
  st.s.assign(static_cast<size_t>(p) * k, 0.0);
  return st;
}

std::vector<double> Apply(const WeightMatrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.rows, 0.0);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) y[r] += static_cast<double>(w.At(r, c)) * x[c];
  }
  return y;
}

double Sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Output rows [T, d] for the new tokens x [T, d]; advances `st`.
std::vector<double> RefKda(const ModelConfig& config, const KdaWeights& w,
                           const std::vector<float>& x, RefState* st) {
  const LinearAttnConfig& la = config.linear_attn;
  const int h = la.num_heads, k = la.head_dim, p = h * k, d = config.hidden_size;
  const int kernel = la.short_conv_kernel_size;
  const int tokens = static_cast<int>(x.size()) / d;
  std::vector<double> out;
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> xt(x.begin() + t * d, x.begin() + (t + 1) * d);
    const WeightMatrix* proj[3] = {&w.q_proj, &w.k_proj, &w.v_proj};
    const std::vector<float>* conv_w[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
    std::vector<double> qkv[3];
    for (int m = 0; m < 3; ++m) {
      std::vector<double> raw = Apply(*proj[m], xt);
      std::vector<std::vector<double>>& hist = st->conv[m];
      qkv[m].assign(p, 0.0);
      for (int c = 0; c < p; ++c) {
        double acc = (*conv_w[m])[c * kernel + kernel - 1] * raw[c];
        for (int i = 0; i < kernel - 1; ++i) acc += (*conv_w[m])[c * kernel + i] * hist[i][c];
        qkv[m][c] = acc * Sigm(acc);
      }
      if (!hist.empty()) {
        hist.erase(hist.begin());
        hist.push_back(raw);
      }
    }
    std::vector<double> f = Apply(w.f_b_proj, Apply(w.f_a_proj, xt));
    std::vector<double> b = Apply(w.b_proj, xt);
    std::vector<double> gate =
        la.use_full_rank_gate ? Apply(w.g_proj, xt) : Apply(w.g_b_proj, Apply(w.g_a_proj, xt));
    std::vector<double> y(p);
    for (int head = 0; head < h; ++head) {
      double qn = 0, kn = 0;
      for (int j = 0; j < k; ++j) {
        qn += qkv[0][head * k + j] * qkv[0][head * k + j];
        kn += qkv[1][head * k + j] * qkv[1][head * k + j];
      }
      std::vector<double> q(k), kk(k), v(k), g(k);
      for (int j = 0; j < k; ++j) {
        const int c = head * k + j;
        q[j] = qkv[0][c] / std::sqrt(qn + 1e-6) / std::sqrt(static_cast<double>(k));
        kk[j] = qkv[1][c] / std::sqrt(kn + 1e-6);
        v[j] = qkv[2][c];
        const double a = std::exp(static_cast<double>(w.a_log[head]));
        const double z = f[c] + w.dt_bias[c];
        g[j] =
            la.gate_lower_bound ? *la.gate_lower_bound * Sigm(a * z) : -a * std::log1p(std::exp(z));
      }
      const double beta = Sigm(b[head]);
      double* s = st->s.data() + static_cast<size_t>(head) * k * k;
      for (int j = 0; j < k; ++j) {
        for (int m = 0; m < k; ++m) s[j * k + m] *= std::exp(g[j]);
      }
      std::vector<double> u(v);
      for (int j = 0; j < k; ++j) {
        for (int m = 0; m < k; ++m) u[m] -= s[j * k + m] * kk[j];
      }
      for (int j = 0; j < k; ++j) {
        for (int m = 0; m < k; ++m) s[j * k + m] += beta * kk[j] * u[m];
      }
      std::vector<double> o(k, 0.0);
      for (int j = 0; j < k; ++j) {
        for (int m = 0; m < k; ++m) o[m] += s[j * k + m] * q[j];
      }
      double ms = 0;
      for (double e : o) ms += e * e / k;
      for (int m = 0; m < k; ++m) {
        y[head * k + m] =
            o[m] / std::sqrt(ms + config.rms_norm_eps) * w.o_norm[m] * Sigm(gate[head * k + m]);
      }
    }
    std::vector<double> o = Apply(w.o_proj, y);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

ModelConfig TinyConfig() {
  ModelConfig config;
  config.hidden_size = 256;
  config.rms_norm_eps = 1e-5f;
  config.linear_attn.num_heads = 4;
  config.linear_attn.head_dim = 32;
  config.linear_attn.short_conv_kernel_size = 4;
  config.linear_attn.gate_lower_bound = -5.0f;
  config.linear_attn.use_full_rank_gate = true;
  return config;
}

// Kimi Linear's flavour: softplus gate (§5.3 B) and the low-rank output gate.
ModelConfig KimiLinearConfig() {
  ModelConfig config = TinyConfig();
  config.linear_attn.gate_lower_bound.reset();
  config.linear_attn.use_full_rank_gate = false;
  return config;
}

// Spec §12.3-style fixture: linear weights N(0, std²), norms 1 + N(0, 0.1²), A_log = log U(1, 16),
// dt_bias N(0, 0.5²), convs U(-0.5, 0.5). Some matrices are stored as F32 to cover both types.
KdaWeights MakeWeights(const ModelConfig& config, RandomWeights* rnd, float stddev = 0.02f) {
  const LinearAttnConfig& la = config.linear_attn;
  const int h = la.num_heads, k = la.head_dim, p = h * k, d = config.hidden_size;
  const int kernel = la.short_conv_kernel_size;
  KdaWeights w;
  w.q_proj = rnd->Matrix(p, d, stddev);
  w.k_proj = rnd->Matrix(p, d, stddev, WeightType::kF32);
  w.v_proj = rnd->Matrix(p, d, stddev);
  w.q_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.k_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.v_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.f_a_proj = rnd->Matrix(k, d, stddev);
  w.f_b_proj = rnd->Matrix(p, k, stddev, WeightType::kF32);
  w.dt_bias = rnd->Normal(p, 0.0f, 0.5f);
  for (float u : rnd->Uniform(h, 1.0f, 16.0f)) w.a_log.push_back(std::log(u));
  w.b_proj = rnd->Matrix(h, d, stddev);
  if (la.use_full_rank_gate) {
    w.g_proj = rnd->Matrix(p, d, stddev);
  } else {
    w.g_a_proj = rnd->Matrix(k, d, stddev);
    w.g_b_proj = rnd->Matrix(p, k, stddev);
  }
  w.o_norm = rnd->Normal(k, 1.0f, 0.1f);
  w.o_proj = rnd->Matrix(d, p, stddev);
  return w;
}

std::vector<float> Forward(const ModelConfig& config, const KdaWeights& w,
                           const std::vector<float>& x, KdaState* state, Scratch* scratch,
                           KdaAlgorithm algorithm) {
  const int64_t tokens = static_cast<int64_t>(x.size()) / config.hidden_size;
  std::vector<float> out(x.size(), NAN);
  absl::Status status =
      KdaForwardBatch(config, w, x.data(), {{state, tokens}}, out.data(), scratch, algorithm);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<float> Slice(const std::vector<float>& x, int64_t first, int64_t count, int64_t d) {
  return std::vector<float>(x.begin() + first * d, x.begin() + (first + count) * d);
}

class KdaTest : public ::testing::TestWithParam<bool> {  // param: K3 gates, else Kimi Linear's
 protected:
  ModelConfig Config() const { return GetParam() ? TinyConfig() : KimiLinearConfig(); }
};

TEST_P(KdaTest, RecurrentMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(1);
  const KdaWeights w = MakeWeights(config, &rnd);
  const std::vector<float> x = rnd.Normal(37 * config.hidden_size, 0.0f, 1.0f);

  KdaState state(config);
  Scratch scratch;
  RefState ref_state = NewRefState(config);
  EXPECT_TRUE(AllClose(Forward(config, w, x, &state, &scratch, KdaAlgorithm::kRecurrent),
                       RefKda(config, w, x, &ref_state), 1e-4));
  EXPECT_TRUE(AllClose(state.s, ref_state.s, 1e-4));
}

TEST_P(KdaTest, ChunkedMatchesRecurrentOverSeveralChunks) {
  const ModelConfig config = Config();
  RandomWeights rnd(2);
  const KdaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  // 150 = 9 chunks + 6; the second call starts from a non-zero state and conv cache.
  const std::vector<float> x = rnd.Normal(230 * d, 0.0f, 1.0f);
  const std::vector<float> first = Slice(x, 0, 150, d), second = Slice(x, 150, 80, d);

  KdaState chunked(config), recurrent(config);
  Scratch scratch;
  EXPECT_TRUE(AllClose(Forward(config, w, first, &chunked, &scratch, KdaAlgorithm::kChunked),
                       Forward(config, w, first, &recurrent, &scratch, KdaAlgorithm::kRecurrent),
                       1e-4));
  EXPECT_TRUE(AllClose(chunked.s, recurrent.s, 1e-4));
  EXPECT_EQ(chunked.conv_v, recurrent.conv_v);
  EXPECT_TRUE(AllClose(Forward(config, w, second, &chunked, &scratch, KdaAlgorithm::kChunked),
                       Forward(config, w, second, &recurrent, &scratch, KdaAlgorithm::kRecurrent),
                       1e-4));
  EXPECT_TRUE(AllClose(chunked.s, recurrent.s, 1e-4));

  RefState ref_state = NewRefState(config);
  std::vector<double> ref = RefKda(config, w, x, &ref_state);
  EXPECT_TRUE(AllClose(chunked.s, ref_state.s, 1e-4));
}

TEST_P(KdaTest, PrefillThenDecodeMatchesReference) {
  const ModelConfig config = Config();
  RandomWeights rnd(3);
  const KdaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size, prefill = 70, decode = 12;
  const std::vector<float> x = rnd.Normal((prefill + decode) * d, 0.0f, 1.0f);

  KdaState state(config);
  Scratch scratch;
  std::vector<float> out =
      Forward(config, w, Slice(x, 0, prefill, d), &state, &scratch, KdaAlgorithm::kAuto);
  for (int64_t t = prefill; t < prefill + decode; ++t) {
    std::vector<float> step =
        Forward(config, w, Slice(x, t, 1, d), &state, &scratch, KdaAlgorithm::kAuto);
    out.insert(out.end(), step.begin(), step.end());
  }
  RefState ref_state = NewRefState(config);
  EXPECT_TRUE(AllClose(out, RefKda(config, w, x, &ref_state), 1e-4));
  for (int m = 0; m < 3; ++m) {
    const std::vector<float>& cache = m == 0 ? state.conv_q : m == 1 ? state.conv_k : state.conv_v;
    std::vector<double> ref_cache;
    for (const auto& row : ref_state.conv[m])
      ref_cache.insert(ref_cache.end(), row.begin(), row.end());
    EXPECT_TRUE(AllClose(cache, ref_cache, 1e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(Gates, KdaTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "K3LowerBoundFullRank" : "SoftplusLowRank";
                         });

// A softplus gate with huge decays: the cumulative log decay over a chunk passes a thousand, so a
// chunked form that divided by e^{G} would overflow.
TEST(KdaChunkedTest, StrongDecayStaysFinite) {
  ModelConfig config = KimiLinearConfig();
  RandomWeights rnd(4);
  KdaWeights w = MakeWeights(config, &rnd);
  for (float& a : w.a_log) a = std::log(16.0f);
  for (size_t c = 0; c < w.dt_bias.size(); ++c) w.dt_bias[c] = (c % 3 == 0) ? 6.0f : -4.0f;
  const std::vector<float> x = rnd.Normal(130 * config.hidden_size, 0.0f, 1.0f);
  KdaState chunked(config), recurrent(config);
  Scratch scratch;
  std::vector<float> out = Forward(config, w, x, &chunked, &scratch, KdaAlgorithm::kChunked);
  EXPECT_TRUE(
      AllClose(out, Forward(config, w, x, &recurrent, &scratch, KdaAlgorithm::kRecurrent), 1e-4));
  EXPECT_TRUE(AllClose(chunked.s, recurrent.s, 1e-4));
}

// Head sizes that are not a multiple of the vector width, an odd head count and a conv kernel of 2.
TEST(KdaChunkedTest, OddShapes) {
  ModelConfig config = TinyConfig();
  config.hidden_size = 72;
  config.linear_attn.num_heads = 3;
  config.linear_attn.head_dim = 20;
  config.linear_attn.short_conv_kernel_size = 2;
  RandomWeights rnd(5);
  const KdaWeights w = MakeWeights(config, &rnd, 0.05f);
  const std::vector<float> x = rnd.Normal(100 * config.hidden_size, 0.0f, 1.0f);
  KdaState state(config);
  Scratch scratch;
  RefState ref_state = NewRefState(config);
  EXPECT_TRUE(AllClose(Forward(config, w, x, &state, &scratch, KdaAlgorithm::kChunked),
                       RefKda(config, w, x, &ref_state), 1e-4));
  EXPECT_TRUE(AllClose(state.s, ref_state.s, 1e-4));
}

// A batch mixing fresh prefills, decode steps on warm states and an empty segment gives each
// sequence what it gets alone.
TEST(KdaBatchTest, MatchesSequencesRunAlone) {
  const ModelConfig config = TinyConfig();
  RandomWeights rnd(8);
  const KdaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  const std::vector<int64_t> history = {0, 30, 0, 5}, fresh = {40, 1, 0, 17};
  std::vector<KdaState> batch_states, alone_states;
  std::vector<std::vector<float>> inputs;
  Scratch scratch;
  for (size_t s = 0; s < history.size(); ++s) {
    inputs.push_back(rnd.Normal((history[s] + fresh[s]) * d, 0.0f, 1.0f));
    batch_states.emplace_back(config);
    if (history[s] > 0) {
      Forward(config, w, Slice(inputs[s], 0, history[s], d), &batch_states[s], &scratch,
              KdaAlgorithm::kAuto);
    }
  }
  alone_states = batch_states;
  std::vector<float> x;
  std::vector<KdaSegment> segments;
  for (size_t s = 0; s < history.size(); ++s) {
    const std::vector<float> rows = Slice(inputs[s], history[s], fresh[s], d);
    x.insert(x.end(), rows.begin(), rows.end());
    segments.push_back({&batch_states[s], fresh[s]});
  }
  std::vector<float> out(x.size(), NAN);
  ASSERT_TRUE(KdaForwardBatch(config, w, x.data(), segments, out.data(), &scratch).ok());
  int64_t row = 0;
  for (size_t s = 0; s < history.size(); ++s) {
    if (fresh[s] == 0) continue;
    const std::vector<float> alone = Forward(config, w, Slice(inputs[s], history[s], fresh[s], d),
                                             &alone_states[s], &scratch, KdaAlgorithm::kAuto);
    EXPECT_TRUE(AllClose(Slice(out, row, fresh[s], d), alone, 1e-5)) << "sequence " << s;
    EXPECT_TRUE(AllClose(batch_states[s].s, alone_states[s].s, 1e-5)) << "sequence " << s;
    // The projections see different row counts, so their rounding may differ.
    EXPECT_TRUE(AllClose(batch_states[s].conv_k, alone_states[s].conv_k, 1e-6)) << "sequence " << s;
    row += fresh[s];
  }
  EXPECT_EQ(batch_states[2].s, std::vector<float>(batch_states[2].s.size(), 0.0f));
}

TEST(KdaStateTest, ResetAndSize) {
  const ModelConfig config = TinyConfig();
  KdaState state(config);
  EXPECT_EQ(state.ByteSize(), (3 * 3 * 128 + 4 * 32 * 32) * sizeof(float));
  RandomWeights rnd(6);
  const KdaWeights w = MakeWeights(config, &rnd);
  Scratch scratch;
  const std::vector<float> x = rnd.Normal(5 * config.hidden_size, 0.0f, 1.0f);
  const std::vector<float> first = Forward(config, w, x, &state, &scratch, KdaAlgorithm::kAuto);
  state.Reset();
  EXPECT_EQ(Forward(config, w, x, &state, &scratch, KdaAlgorithm::kAuto), first);
}

TEST(KdaValidationTest, RejectsMismatchedStateAndWeights) {
  const ModelConfig config = TinyConfig();
  RandomWeights rnd(7);
  KdaWeights w = MakeWeights(config, &rnd);
  std::vector<float> x(config.hidden_size, 1.0f), out(config.hidden_size, 0.0f);
  Scratch scratch;

  ModelConfig other = config;
  other.linear_attn.num_heads = 2;
  KdaState wrong(other);
  absl::Status status = KdaForwardBatch(config, w, x.data(), {{&wrong, 1}}, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("state"), std::string::npos) << status;

  KdaState state(config);
  w.g_proj = WeightMatrix();
  status = KdaForwardBatch(config, w, x.data(), {{&state, 1}}, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("g_proj"), std::string::npos) << status;
  EXPECT_EQ(state.s, std::vector<float>(state.s.size(), 0.0f));
}

}  // namespace
}  // namespace k3
