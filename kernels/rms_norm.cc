#include "kernels/rms_norm.h"

#include <cmath>

#include "kernels/simd.h"
#include "kernels/step_profile.h"

namespace k3 {
namespace {

typedef double Vec8d __attribute__((vector_size(64)));

K3_SIMD_INLINE double Sum(Vec8d v) {
  typedef double Vec4d __attribute__((vector_size(32)));
  const Vec4d s4 =
      __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// y = (x · alpha) ⊙ gamma; y may equal x.
K3_VECTOR_CLONES
void ScaleByVector(const float* x, float alpha, const float* gamma, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    simd::Store(y + i, simd::Load(x + i) * alpha * simd::Load(gamma + i));
  }
  for (; i < n; ++i) y[i] = x[i] * alpha * gamma[i];
}

}  // namespace

K3_VECTOR_CLONES
double SumOfSquares(const float* x, int64_t n) {
  // fp32 loads widened to two fp64 halves: the square of a float is exact in double, so the only
  // rounding left is in the additions.
  Vec8d acc_lo{}, acc_hi{};
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    const simd::Vec16 v = simd::Load(x + i);
    const Vec8d lo =
        __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), Vec8d);
    const Vec8d hi = __builtin_convertvector(
        __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), Vec8d);
    acc_lo += lo * lo;
    acc_hi += hi * hi;
  }
  double sum = Sum(acc_lo + acc_hi);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void RmsNormRows(const float* x, int64_t x_stride, int64_t rows, int64_t width, const float* gamma,
                 float eps, float* y, int64_t y_stride) {
  const ScopedStepPart profile(StepPart::kNorms);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    const double mean_square = SumOfSquares(xr, width) / static_cast<double>(width);
    const float inv = static_cast<float>(1.0 / std::sqrt(mean_square + eps));
    ScaleByVector(xr, inv, gamma, y + r * y_stride, width);
  }
}

}  // namespace k3
