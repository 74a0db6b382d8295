// Slow fp64 primitives of the K3 forward pass (spec §3, §4.1, §5.3-§5.4, §7.2), written straight
// from the spec for the reference model (reference/k3_reference.h) and for tests that check the
// optimized engine against them. Nothing here is tuned; every loop is the formula as written.
//
// Sizes are checked with CHECK: the callers (the reference model and tests) validate the
// checkpoint before they get here, so a mismatch is a programming error.
//
// Thread-safety: pure functions on values.
#ifndef K3SERVE_REFERENCE_OPS_H_
#define K3SERVE_REFERENCE_OPS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "model/config.h"

namespace k3::reference {

using Vec = std::vector<double>;
// A sequence of per-position vectors: rows[t] is position t.
using Rows = std::vector<Vec>;

// A Linear weight [rows = out, cols = in], row-major: y = W x.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;

  double At(int64_t r, int64_t c) const { return data[r * cols + c]; }
  Vec Apply(const Vec& x) const;
  Rows Apply(const Rows& x) const;  // Apply to every position
};

double Sigmoid(double x);
double Silu(double x);
double Softplus(double x);

// SiTU(a) = beta * tanh(a / beta) * sigmoid(a) (spec §3.2).
double Situ(double a, double beta);

// The gated activation of one GLU coordinate, gate `a` and up `b` (spec §3.2):
// kSitu: Situ(a, situ_beta) * (linear_beta ? linear_beta * tanh(b / linear_beta) : b);
// kSilu: Silu(a) * b.
double GluActivation(Activation act, double a, double b, double situ_beta,
                     std::optional<double> linear_beta);

// gamma ⊙ x / sqrt(mean(x²) + eps) (spec §3.1).
Vec RmsNorm(const Vec& x, const Vec& gamma, double eps);

// x / sqrt(Σx² + 1e-6) (spec §3.3).
Vec L2Normalize(const Vec& x);

// Block AttnRes depth attention at one position (spec §4.1): softmax over sources of
// wᵀ RMSNorm_gamma(V_i), then Σ α_i V_i over the raw sources. REQUIRES: sources non-empty.
Vec AttnRes(const std::vector<Vec>& sources, const Vec& proj, const Vec& norm, double eps);

// Causal depthwise conv followed by SiLU (spec §3.4): x [T, C], weight [C, K] where column K-1
// multiplies the current position; positions before 0 count as zero.
Rows CausalConvSilu(const Rows& x, const Matrix& weight);

// The KDA log-space decay of one channel (spec §5.3), given f + dt_bias and the head's A_log:
// option A (lower_bound set): lower_bound * sigmoid(exp(a_log) * f_plus_bias);
// option B: -exp(a_log) * softplus(f_plus_bias).
double KdaLogDecay(double f_plus_bias, double a_log, std::optional<double> lower_bound);

// The KDA delta-rule recurrence of spec §5.4, all heads, state starting at zero.
// q, k, v, g: [T, heads * head_dim] head-major (v uses head_dim as its width too); beta: [T, heads]
// (already through the sigmoid). q and k are L2-normalized here and q is scaled by head_dim^-1/2.
// Returns o: [T, heads * head_dim].
Rows KdaRecurrence(const Rows& q, const Rows& k, const Rows& v, const Rows& g, const Rows& beta,
                   int heads, int head_dim);

// The router's choice for one token (spec §7.2), given the sigmoid scores s and the selection bias:
// the k largest s + bias (ties: lower expert id first), in descending order of s + bias, with
// weights s_j / (Σ_selected s + 1e-20) when `renormalize` and k > 1 (else s_j), times `scaling`.
struct Routing {
  std::vector<int> experts;
  std::vector<double> weights;
};
Routing RouteTopK(const Vec& scores, const Vec& bias, int k, bool renormalize, double scaling);

}  // namespace k3::reference

#endif  // K3SERVE_REFERENCE_OPS_H_
