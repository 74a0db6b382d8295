// The transposed weight product y = Wᵀ x, for MLA's absorbed attention (W^UK folded into the
// queries, spec §6.2): W is a checkpoint weight [rows, cols] as in kernels/matmul.h, read once, row
// by row, whatever the token count. Columns are split across the kernel thread pool.
//
// Thread-safety: a pure function of its arguments (it runs on the kernel pool).
#ifndef K3SERVE_KERNELS_MATMUL_TRANSPOSED_H_
#define K3SERVE_KERNELS_MATMUL_TRANSPOSED_H_

#include <cstdint>

#include "kernels/matmul.h"

namespace k3 {

// y[t, :] = Wᵀ x[t, :], i.e. y[t, c] = Σ_r W[r, c] · x[t, r], for fp32 or BF16 weights: x is
// [tokens, W.rows] (stride x_stride), y is [tokens, W.cols] (stride y_stride).
// REQUIRES: W is not kMxfp4 (checked); x and y do not overlap.
void MatMulTransposed(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                      float* y, int64_t y_stride);

}  // namespace k3

#endif  // K3SERVE_KERNELS_MATMUL_TRANSPOSED_H_
