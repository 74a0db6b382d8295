#include "reference/ops.h"

#include <cmath>

#include "gtest/gtest.h"

namespace k3::reference {
namespace {

// Spec §3.2, check values for b = 3 with beta = 4, linear_beta = 25 (given to 3 decimals).
TEST(OpsTest, SituGluMatchesSpecTable) {
  const double kBeta = 4.0;
  const double kLinearBeta = 25.0;
  struct Case {
    double a, b, expected, tolerance;
  };
  const Case cases[] = {{-2, 3, -0.658, 5e-4},
                        {0, 3, 0.0, 1e-12},
                        {2, 3, 4.861, 5e-4},
                        {8, 3, 11.509, 5e-4},
                        {40, 40, 92.17, 5e-3}};
  for (const Case& c : cases) {
    EXPECT_NEAR(GluActivation(Activation::kSitu, c.a, c.b, kBeta, kLinearBeta), c.expected,
                c.tolerance)
        << "a=" << c.a << " b=" << c.b;
  }
  // Without a linear_beta the up branch is not soft-capped: 40 * SiTU(40) ~ 40 * 4.
  EXPECT_NEAR(GluActivation(Activation::kSitu, 40, 40, kBeta, std::nullopt), 160.0, 1e-6);
}

TEST(OpsTest, SiluGluIsSwiGlu) {
  // SiLU(2) * 3 with sigmoid(2) = 0.8807970779778823.
  EXPECT_NEAR(GluActivation(Activation::kSilu, 2, 3, 4.0, std::nullopt), 2 * 0.8807970779778823 * 3,
              1e-12);
  EXPECT_DOUBLE_EQ(Softplus(0.0), std::log(2.0));
  EXPECT_NEAR(Softplus(-50.0), std::exp(-50.0), 1e-30);
  EXPECT_DOUBLE_EQ(Softplus(50.0), 50.0);
}

TEST(OpsTest, RmsNormAndL2NormByHand) {
  // x = (3, 4): mean(x²) = 12.5, Σx² = 25.
  Vec r = RmsNorm({3, 4}, {1, 2}, 1e-5);
  EXPECT_DOUBLE_EQ(r[0], 3 / std::sqrt(12.5 + 1e-5));
  EXPECT_DOUBLE_EQ(r[1], 8 / std::sqrt(12.5 + 1e-5));
  Vec l = L2Normalize({3, 4});
  EXPECT_DOUBLE_EQ(l[0], 3 / std::sqrt(25 + 1e-6));
  EXPECT_DOUBLE_EQ(l[1], 4 / std::sqrt(25 + 1e-6));
}

// §12.4 identity 5: a zero query gives equal scores, so the read is the exact mean.
TEST(OpsTest, AttnResWithZeroQueryIsTheMean) {
  std::vector<Vec> sources = {{1, -2, 3, 0.5}, {10, 20, -30, 4}, {-7, 0, 0.25, 8}};
  Vec out = AttnRes(sources, Vec(4, 0.0), {1.3, 0.7, 1.1, 0.9}, 1e-5);
  for (int j = 0; j < 4; ++j) {
    EXPECT_DOUBLE_EQ(out[j], (sources[0][j] + sources[1][j] + sources[2][j]) / 3) << j;
  }
}

TEST(OpsTest, AttnResTwoSourcesByHand) {
  // V0 = (3, 4): rms² = 12.5; V1 = (1, 0): rms² = 0.5. Query w = (1, 0), gain (2, 1):
  // e0 = 2·3/√12.5, e1 = 2·1/√0.5; two-way softmax: α1 = σ(e1 - e0). eps = 0 to keep it exact.
  std::vector<Vec> sources = {{3, 4}, {1, 0}};
  Vec out = AttnRes(sources, {1, 0}, {2, 1}, 0.0);
  double e0 = 6 / std::sqrt(12.5);
  double e1 = 2 / std::sqrt(0.5);
  double a1 = 1 / (1 + std::exp(e0 - e1));
  EXPECT_NEAR(out[0], (1 - a1) * 3 + a1 * 1, 1e-14);
  EXPECT_NEAR(out[1], (1 - a1) * 4, 1e-14);
  // The mix uses the raw sources: scaling a source changes the output, not its score.
  Vec scaled = AttnRes({{30, 40}, {1, 0}}, {1, 0}, {2, 1}, 0.0);
  EXPECT_NEAR(scaled[1], (1 - a1) * 40, 1e-12);
}

TEST(OpsTest, CausalConvByHand) {
  // One channel, K = 4, w = (1, 2, 3, 4) where 4 multiplies the current token.
  Matrix w{1, 4, {1, 2, 3, 4}};
  Rows y = CausalConvSilu({{1}, {-1}, {0.5}, {2}}, w);
  ASSERT_EQ(y.size(), 4u);
  EXPECT_DOUBLE_EQ(y[0][0], Silu(4 * 1));
  EXPECT_DOUBLE_EQ(y[1][0], Silu(3 * 1 + 4 * -1));
  EXPECT_DOUBLE_EQ(y[2][0], Silu(2 * 1 + 3 * -1 + 4 * 0.5));
  EXPECT_DOUBLE_EQ(y[3][0], Silu(1 * 1 + 2 * -1 + 3 * 0.5 + 4 * 2));
}

TEST(OpsTest, KdaLogDecayBothOptions) {
  const double kSigmoid2 = 0.8807970779778823;
  // Option A: lower_bound * σ(exp(A_log) (f + dt_bias)).
  EXPECT_DOUBLE_EQ(KdaLogDecay(0.0, 0.0, -5.0), -2.5);
  EXPECT_NEAR(KdaLogDecay(1.0, std::log(2.0), -5.0), -5 * kSigmoid2, 1e-14);
  // Option B: -exp(A_log) softplus(f + dt_bias).
  EXPECT_NEAR(KdaLogDecay(0.0, 0.0, std::nullopt), -std::log(2.0), 1e-15);
  EXPECT_NEAR(KdaLogDecay(0.0, std::log(3.0), std::nullopt), -3 * std::log(2.0), 1e-14);
}

// §5.4 by hand for one head with K = V = 2 over two tokens.
TEST(OpsTest, KdaRecurrenceTwoTokensByHand) {
  const double l0 = std::log(0.5), l1 = std::log(0.25);
  Rows q = {{1, 0}, {1, 1}};
  Rows k = {{1, 0}, {3, 4}};
  Rows v = {{1, 2}, {-1, 0.5}};
  Rows g = {{0, 0}, {l0, l1}};
  Rows beta = {{0.5}, {0.8}};
  Rows o = KdaRecurrence(q, k, v, g, beta, /*heads=*/1, /*head_dim=*/2);

  const double s = 1 / std::sqrt(2.0);        // K^-1/2
  const double n = 1 / std::sqrt(1 + 1e-6);   // l2n of a unit vector
  const double m = 1 / std::sqrt(25 + 1e-6);  // l2n of (3, 4)
  const double p = 1 / std::sqrt(2 + 1e-6);   // l2n of (1, 1)
  // Token 0: S = β0 k̂0 v0ᵀ, only key row 0 is non-zero: S[0] = 0.5 n (1, 2); q̂0 = (n s, 0).
  EXPECT_NEAR(o[0][0], n * s * 0.5 * n, 1e-14);
  EXPECT_NEAR(o[0][1], n * s * n, 1e-14);
  // Token 1: decay row 0 by 0.5 (row 1 is zero): S[0] = (0.25 n, 0.5 n).
  // prediction = Sᵀ k̂1 = 3m S[0]; delta = v1 - prediction.
  const double d0 = -1 - 3 * m * 0.25 * n;
  const double d1 = 0.5 - 3 * m * 0.5 * n;
  // Write: S[0] += 0.8·3m·delta, S[1] += 0.8·4m·delta; read with q̂1 = p s (1, 1).
  EXPECT_NEAR(o[1][0], p * s * (0.25 * n + 0.8 * 7 * m * d0), 1e-14);
  EXPECT_NEAR(o[1][1], p * s * (0.5 * n + 0.8 * 7 * m * d1), 1e-14);

  // Two heads: the second has the same q, k, g, β and twice the values. The state is linear in
  // v, so its output is twice the first head's; heads do not mix.
  Rows q2, k2, v2, g2, beta2;
  for (int t = 0; t < 2; ++t) {
    q2.push_back({q[t][0], q[t][1], q[t][0], q[t][1]});
    k2.push_back({k[t][0], k[t][1], k[t][0], k[t][1]});
    v2.push_back({v[t][0], v[t][1], 2 * v[t][0], 2 * v[t][1]});
    g2.push_back({g[t][0], g[t][1], g[t][0], g[t][1]});
    beta2.push_back({beta[t][0], beta[t][0]});
  }
  Rows o2 = KdaRecurrence(q2, k2, v2, g2, beta2, /*heads=*/2, /*head_dim=*/2);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(o2[t][i], o[t][i], 1e-15);
      EXPECT_NEAR(o2[t][2 + i], 2 * o[t][i], 1e-14);
    }
  }
}

// The delta rule with β = 1 and no decay stores v exactly under a unit key: reading it back with
// the same key returns v (up to the 1e-6 of the L2 norm), whatever was stored before.
TEST(OpsTest, KdaDeltaRuleOverwrites) {
  Rows q = {{0, 0, 0}, {0.6, 0, 0.8}};
  Rows k = {{1, 2, 2}, {0.6, 0, 0.8}};
  Rows v = {{5, -1, 2}, {0.25, -3, 7}};
  Rows g(2, Vec(3, 0.0));
  Rows beta = {{1.0}, {1.0}};
  Rows o = KdaRecurrence(q, k, v, g, beta, 1, 3);
  const double scale = 1 / std::sqrt(3.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(o[1][i], v[1][i] * scale, 1e-5) << i;
}

// §12.4 identity 6: the bias changes which experts are chosen, never their weights.
TEST(OpsTest, RouterBiasSelectsButDoesNotWeigh) {
  Vec s = {0.9, 0.2, 0.7, 0.4, 0.6};
  Vec no_bias(5, 0.0);
  Routing plain = RouteTopK(s, no_bias, 2, true, 1.0);
  EXPECT_EQ(plain.experts, (std::vector<int>{0, 2}));
  EXPECT_NEAR(plain.weights[0], 0.9 / 1.6, 1e-15);
  EXPECT_NEAR(plain.weights[1], 0.7 / 1.6, 1e-15);

  Vec bias = {0.0, 0.8, 0.0, 0.0, 0.0};  // expert 1: choice 1.0 beats every other
  Routing biased = RouteTopK(s, bias, 2, true, 2.5);
  EXPECT_EQ(biased.experts, (std::vector<int>{1, 0}));
  EXPECT_NEAR(biased.weights[0], 2.5 * 0.2 / 1.1, 1e-15);
  EXPECT_NEAR(biased.weights[1], 2.5 * 0.9 / 1.1, 1e-15);

  Routing raw = RouteTopK(s, bias, 2, false, 1.0);
  EXPECT_NEAR(raw.weights[0], 0.2, 1e-15);
  EXPECT_NEAR(raw.weights[1], 0.9, 1e-15);
  Routing single = RouteTopK(s, no_bias, 1, true, 1.0);  // k = 1 is never renormalized
  EXPECT_NEAR(single.weights[0], 0.9, 1e-15);
}

TEST(OpsTest, RouterTiesPickLowerIdFirst) {
  Vec s = {0.5, 0.7, 0.7, 0.5};
  Routing r = RouteTopK(s, Vec(4, 0.0), 3, true, 1.0);
  EXPECT_EQ(r.experts, (std::vector<int>{1, 2, 0}));
}

}  // namespace
}  // namespace k3::reference
