#include "reference/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "glog/logging.h"

namespace k3::reference {

Vec Matrix::Apply(const Vec& x) const {
  CHECK_EQ(static_cast<int64_t>(x.size()), cols);
  Vec y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += At(r, c) * x[c];
    y[r] = sum;
  }
  return y;
}

Rows Matrix::Apply(const Rows& x) const {
  Rows y;
  y.reserve(x.size());
  for (const Vec& row : x) y.push_back(Apply(row));
  return y;
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double Silu(double x) { return x * Sigmoid(x); }

double Softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }

double Situ(double a, double beta) { return beta * std::tanh(a / beta) * Sigmoid(a); }

double GluActivation(Activation act, double a, double b, double situ_beta,
                     std::optional<double> linear_beta) {
  if (act == Activation::kSilu) return Silu(a) * b;
  double up = linear_beta ? *linear_beta * std::tanh(b / *linear_beta) : b;
  return Situ(a, situ_beta) * up;
}

Vec RmsNorm(const Vec& x, const Vec& gamma, double eps) {
  CHECK_EQ(x.size(), gamma.size());
  double sum_sq = 0.0;
  for (double v : x) sum_sq += v * v;
  double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = gamma[i] * x[i] * inv;
  return y;
}

Vec L2Normalize(const Vec& x) {
  double sum_sq = 0.0;
  for (double v : x) sum_sq += v * v;
  double inv = 1.0 / std::sqrt(sum_sq + 1e-6);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv;
  return y;
}

Vec AttnRes(const std::vector<Vec>& sources, const Vec& proj, const Vec& norm, double eps) {
  CHECK(!sources.empty());
  const size_t d = proj.size();
  CHECK_EQ(norm.size(), d);
  std::vector<double> scores(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    Vec normalized = RmsNorm(sources[i], norm, eps);
    double score = 0.0;
    for (size_t j = 0; j < d; ++j) score += proj[j] * normalized[j];
    scores[i] = score;
  }
  double max_score = *std::max_element(scores.begin(), scores.end());
  double total = 0.0;
  for (double& s : scores) {
    s = std::exp(s - max_score);
    total += s;
  }
  Vec out(d, 0.0);
  for (size_t i = 0; i < sources.size(); ++i) {
    double alpha = scores[i] / total;
    for (size_t j = 0; j < d; ++j) out[j] += alpha * sources[i][j];
  }
  return out;
}

Rows CausalConvSilu(const Rows& x, const Matrix& weight) {
  const int64_t kernel = weight.cols;
  Rows y(x.size(), Vec(weight.rows, 0.0));
  for (size_t t = 0; t < x.size(); ++t) {
    CHECK_EQ(static_cast<int64_t>(x[t].size()), weight.rows);
    for (int64_t c = 0; c < weight.rows; ++c) {
      double sum = 0.0;
      for (int64_t i = 0; i < kernel; ++i) {
        int64_t source = static_cast<int64_t>(t) - (kernel - 1) + i;
        if (source >= 0) sum += weight.At(c, i) * x[source][c];
      }
      y[t][c] = Silu(sum);
    }
  }
  return y;
}

double KdaLogDecay(double f_plus_bias, double a_log, std::optional<double> lower_bound) {
  if (lower_bound) return *lower_bound * Sigmoid(std::exp(a_log) * f_plus_bias);
  return -std::exp(a_log) * Softplus(f_plus_bias);
}

Rows KdaRecurrence(const Rows& q, const Rows& k, const Rows& v, const Rows& g, const Rows& beta,
                   int heads, int head_dim) {
  const size_t steps = q.size();
  CHECK_EQ(k.size(), steps);
  CHECK_EQ(v.size(), steps);
  CHECK_EQ(g.size(), steps);
  CHECK_EQ(beta.size(), steps);
  const int dim = head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  Rows out(steps, Vec(static_cast<size_t>(heads) * dim, 0.0));
  for (int h = 0; h < heads; ++h) {
    // state[j][i]: key row j, value column i (S ∈ R^{K×V}).
    std::vector<Vec> state(dim, Vec(dim, 0.0));
    for (size_t t = 0; t < steps; ++t) {
      auto head_slice = [&](const Vec& row) {
        CHECK_EQ(row.size(), static_cast<size_t>(heads) * dim);
        return Vec(row.begin() + h * dim, row.begin() + (h + 1) * dim);
      };
      Vec q_hat = L2Normalize(head_slice(q[t]));
      for (double& x : q_hat) x *= scale;
      Vec k_hat = L2Normalize(head_slice(k[t]));
      Vec v_t = head_slice(v[t]);
      Vec g_t = head_slice(g[t]);
      for (int j = 0; j < dim; ++j) {
        double decay = std::exp(g_t[j]);
        for (int i = 0; i < dim; ++i) state[j][i] *= decay;
      }
      Vec delta(dim);
      for (int i = 0; i < dim; ++i) {
        double prediction = 0.0;
        for (int j = 0; j < dim; ++j) prediction += state[j][i] * k_hat[j];
        delta[i] = v_t[i] - prediction;
      }
      const double b = beta[t][h];
      for (int j = 0; j < dim; ++j) {
        for (int i = 0; i < dim; ++i) state[j][i] += b * k_hat[j] * delta[i];
      }
      for (int i = 0; i < dim; ++i) {
        double read = 0.0;
        for (int j = 0; j < dim; ++j) read += state[j][i] * q_hat[j];
        out[t][h * dim + i] = read;
      }
    }
  }
  return out;
}

Routing RouteTopK(const Vec& scores, const Vec& bias, int k, bool renormalize, double scaling) {
  CHECK_EQ(scores.size(), bias.size());
  CHECK_GT(k, 0);
  CHECK_LE(static_cast<size_t>(k), scores.size());
  std::vector<int> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return scores[a] + bias[a] > scores[b] + bias[b]; });
  Routing routing;
  routing.experts.assign(order.begin(), order.begin() + k);
  double total = 0.0;
  for (int e : routing.experts) total += scores[e];
  for (int e : routing.experts) {
    double w = (renormalize && k > 1) ? scores[e] / (total + 1e-20) : scores[e];
    routing.weights.push_back(w * scaling);
  }
  return routing;
}

}  // namespace k3::reference
