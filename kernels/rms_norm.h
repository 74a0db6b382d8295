// RMSNorm (spec §3.1): y = γ ⊙ x / sqrt(mean(x²) + ε), the one implementation every tier uses.
//
// The sum of squares is accumulated in double inside 16-lane fp32 vectors (kernels/simd.h), so a
// row of any width loses nothing before the root, and the result matches an fp64 reference to fp32
// rounding of the final products. Compiled for AVX-512, AVX2 and baseline x86-64; the loader picks
// one per CPU.
//
// Thread-safety: pure functions of their arguments.
#ifndef K3SERVE_KERNELS_RMS_NORM_H_
#define K3SERVE_KERNELS_RMS_NORM_H_

#include <cstdint>

namespace k3 {

// y[r, :] = gamma ⊙ x[r, :] / sqrt(mean(x[r, :]²) + eps) for r in [0, rows), `gamma` holding
// `width` gains. `x` and `y` have row strides x_stride, y_stride (>= width); y may equal x with
// the same stride (in place).
void RmsNormRows(const float* x, int64_t x_stride, int64_t rows, int64_t width, const float* gamma,
                 float eps, float* y, int64_t y_stride);

// Σ x[i]² over n values, accumulated in double (also the reduction of the KDA L2 norm).
double SumOfSquares(const float* x, int64_t n);

}  // namespace k3

#endif  // K3SERVE_KERNELS_RMS_NORM_H_
