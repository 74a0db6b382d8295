#include "kernels/gated_mlp.h"

#include <algorithm>

#include "kernels/simd.h"
#include "kernels/step_profile.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

using simd::Vec16;

// tanh(x): odd series to x^9 for |x| < 0.3 (next term below 2e-8 relative), else
// (1 - e^-2|x|) / (1 + e^-2|x|) with x's sign.
K3_SIMD_INLINE Vec16 Tanh(Vec16 x) {
  const Vec16 a = x < 0 ? -x : x;
  const Vec16 e = simd::Exp(-2.0f * a);
  const Vec16 big = (1.0f - e) / (1.0f + e);
  const Vec16 x2 = x * x;
  Vec16 series = simd::Splat(62.0f / 2835.0f);
  series = series * x2 - 17.0f / 315.0f;
  series = series * x2 + 2.0f / 15.0f;
  series = series * x2 - 1.0f / 3.0f;
  series = x + x * x2 * series;
  return a < 0.3f ? series : (x < 0 ? -big : big);
}

K3_SIMD_INLINE Vec16 Sigmoid(Vec16 x) { return 1.0f / (1.0f + simd::Exp(-x)); }

K3_SIMD_INLINE Vec16 Combine(const GluParams& p, Vec16 a, Vec16 b) {
  const Vec16 capped = p.linear_beta > 0.f ? p.linear_beta * Tanh(b / p.linear_beta) : b;
  const Vec16 activated = p.situ ? p.beta * Tanh(a / p.beta) * Sigmoid(a) : a * Sigmoid(a);
  return activated * capped;
}

}  // namespace

K3_VECTOR_CLONES
void GluCombineRow(const GluParams& p, float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    simd::Store(gate + i, Combine(p, simd::Load(gate + i), simd::Load(up + i)));
  }
  if (i < n) {  // the tail through the same formulas, in a zero-padded vector
    float a[simd::kWidth] = {}, b[simd::kWidth] = {};
    std::copy(gate + i, gate + n, a);
    std::copy(up + i, up + n, b);
    const Vec16 c = Combine(p, simd::Load(a), simd::Load(b));
    for (int64_t j = i; j < n; ++j) gate[j] = c[j - i];
  }
}

void GatedMlp(const GatedMlpMatrices& w, const GluParams& params, const float* x, int64_t tokens,
              float* y, bool accumulate, std::vector<float>* scratch) {
  const ScopedStepPart profile(StepPart::kGatedMlp);
  const int64_t width = w.gate.rows;
  // gate and up side by side, [tokens, 2 * width], so one buffer serves both products.
  scratch->resize(static_cast<size_t>(tokens * 2 * width));
  float* gate_up = scratch->data();
  const MatMulTask gate_and_up[2] = {{&w.gate, x, w.gate.cols, gate_up, 2 * width, false},
                                     {&w.up, x, w.up.cols, gate_up + width, 2 * width, false}};
  MatMulBatch(gate_and_up, 2, tokens);
  ParallelFor(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = gate_up + t * 2 * width;
      GluCombineRow(params, row, row + width, width);
    }
  });
  MatMul(w.down, gate_up, 2 * width, tokens, y, w.down.rows, accumulate);
}

}  // namespace k3
