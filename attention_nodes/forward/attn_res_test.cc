#include "attention_nodes/forward/attn_res.h"

#include <cmath>
#include <vector>

#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using mixer_test::AllClose;
using mixer_test::RandomWeights;

// Spec §4.1 in fp64, one row at a time: q = γ ⊙ w, e_i = (V_i·q) / sqrt(mean(V_i²) + ε).
std::vector<double> RefAttnRes(const std::vector<std::vector<float>>& sources, int64_t rows,
                               int64_t dim, const std::vector<float>& proj,
                               const std::vector<float>& norm, double eps) {
  std::vector<double> out(rows * dim, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<double> e;
    for (const auto& v : sources) {
      double dot = 0, ms = 0;
      for (int64_t k = 0; k < dim; ++k) {
        dot += v[t * dim + k] * static_cast<double>(norm[k]) * proj[k];
        ms += static_cast<double>(v[t * dim + k]) * v[t * dim + k] / dim;
      }
      e.push_back(dot / std::sqrt(ms + eps));
    }
    double max = -INFINITY, sum = 0;
    for (double s : e) max = std::max(max, s);
    for (double& s : e) sum += (s = std::exp(s - max));
    for (size_t i = 0; i < sources.size(); ++i) {
      for (int64_t k = 0; k < dim; ++k) out[t * dim + k] += e[i] / sum * sources[i][t * dim + k];
    }
  }
  return out;
}

std::vector<const float*> Pointers(const std::vector<std::vector<float>>& sources) {
  std::vector<const float*> p;
  for (const auto& s : sources) p.push_back(s.data());
  return p;
}

TEST(AttnResTest, ZeroQueryGivesTheMeanOfTheSources) {
  RandomWeights rnd(21);
  const int64_t rows = 5, dim = 256;
  std::vector<std::vector<float>> sources;
  for (int i = 0; i < 4; ++i) sources.push_back(rnd.Normal(rows * dim, 0.0f, 1.0f + i));
  const std::vector<float> proj(dim, 0.0f), norm = rnd.Normal(dim, 1.0f, 0.1f);
  std::vector<float> out(rows * dim);
  AttnResRead(Pointers(sources), rows, dim, proj.data(), norm.data(), 1e-5f, out.data());
  std::vector<double> mean(rows * dim, 0.0);
  for (const auto& s : sources) {
    for (int64_t k = 0; k < rows * dim; ++k) mean[k] += s[k] / 4.0;
  }
  EXPECT_TRUE(AllClose(out, mean, 1e-6));
}

TEST(AttnResTest, MatchesReference) {
  RandomWeights rnd(22);
  for (int64_t dim : {256, 100}) {
    for (int n : {1, 2, 9}) {
      const int64_t rows = 7;
      std::vector<std::vector<float>> sources;
      for (int i = 0; i < n; ++i) sources.push_back(rnd.Normal(rows * dim, 0.0f, 0.5f + i));
      // std 0.1 queries over d = 100..256 give scores of a few units: a clearly non-uniform mix.
      const std::vector<float> proj = rnd.Normal(dim, 0.0f, 0.1f);
      const std::vector<float> norm = rnd.Normal(dim, 1.0f, 0.1f);
      std::vector<float> out(rows * dim);
      AttnResRead(Pointers(sources), rows, dim, proj.data(), norm.data(), 1e-5f, out.data());
      EXPECT_TRUE(AllClose(out, RefAttnRes(sources, rows, dim, proj, norm, 1e-5), 1e-5))
          << "dim " << dim << ", " << n << " sources";
    }
  }
}

TEST(AttnResTest, OutputMayBeTheLastSource) {
  RandomWeights rnd(23);
  const int64_t rows = 3, dim = 300;
  std::vector<std::vector<float>> sources;
  for (int i = 0; i < 3; ++i) sources.push_back(rnd.Normal(rows * dim, 0.0f, 1.0f));
  const std::vector<float> proj = rnd.Normal(dim, 0.0f, 0.1f), norm = rnd.Normal(dim, 1.0f, 0.1f);
  const std::vector<double> ref = RefAttnRes(sources, rows, dim, proj, norm, 1e-5);
  AttnResRead(Pointers(sources), rows, dim, proj.data(), norm.data(), 1e-5f, sources[2].data());
  EXPECT_TRUE(AllClose(sources[2], ref, 1e-5));
}

}  // namespace
}  // namespace k3
