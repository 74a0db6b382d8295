#include "attention_nodes/forward/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_nodes/forward/layer_math.h"
#include "glog/logging.h"
#include "kernels/fp32_products.h"
#include "kernels/simd.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

// Σ_k v_k q1_k q2_k and Σ_k v_k², in one pass over v.
K3_VECTOR_CLONES
void ScoreTerms(const float* v, const float* q1, const float* q2, int64_t n, float* dot,
                float* squares) {
  simd::Vec16 acc_dot{}, acc_sq{};
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    const simd::Vec16 x = simd::Load(v + i);
    acc_dot += x * simd::Load(q1 + i) * simd::Load(q2 + i);
    acc_sq += x * x;
  }
  float sum_dot = simd::Sum(acc_dot), sum_sq = simd::Sum(acc_sq);
  for (; i < n; ++i) {
    sum_dot += v[i] * q1[i] * q2[i];
    sum_sq += v[i] * v[i];
  }
  *dot = sum_dot;
  *squares = sum_sq;
}

// out = Σ_i alpha_i src_i over one row. Each column block is summed on the stack before it is
// stored, so out may alias a source.
void MixRow(const float* const* src, const float* alpha, int n, int64_t offset, int64_t dim,
            float* out) {
  constexpr int64_t kBlock = 256;
  float sum[kBlock];
  for (int64_t k0 = 0; k0 < dim; k0 += kBlock) {
    const int64_t len = std::min(kBlock, dim - k0);
    std::fill_n(sum, len, 0.0f);
    for (int i = 0; i < n; ++i) Axpy(alpha[i], src[i] + offset + k0, sum, len);
    std::copy_n(sum, len, out + offset + k0);
  }
}

}  // namespace

void AttnResRead(absl::Span<const float* const> sources, int64_t rows, int64_t dim,
                 const float* proj, const float* norm, float eps, float* out) {
  CHECK(!sources.empty()) << "AttnRes needs at least one source";
  const int n = static_cast<int>(sources.size());
  ParallelFor(rows, std::max<int64_t>(1, 16384 / (dim * n)), [&](int64_t r0, int64_t r1) {
    // At most a handful of sources (ceil(L / block) + 1), so they fit on the stack in practice;
    // the vector is only a fallback for unusual configs.
    constexpr int kInline = 32;
    float inline_alpha[kInline];
    std::vector<float> heap_alpha(n > kInline ? n : 0);
    float* alpha = n > kInline ? heap_alpha.data() : inline_alpha;
    for (int64_t t = r0; t < r1; ++t) {
      const int64_t offset = t * dim;
      float max = -INFINITY;
      for (int i = 0; i < n; ++i) {
        float dot, squares;
        ScoreTerms(sources[i] + offset, proj, norm, dim, &dot, &squares);
        alpha[i] = dot / std::sqrt(squares / static_cast<float>(dim) + eps);
        max = std::max(max, alpha[i]);
      }
      float sum = 0.0f;
      for (int i = 0; i < n; ++i) {
        alpha[i] = std::exp(alpha[i] - max);
        sum += alpha[i];
      }
      for (int i = 0; i < n; ++i) alpha[i] /= sum;
      MixRow(sources.data(), alpha, n, offset, dim, out);
    }
  });
}

}  // namespace k3
