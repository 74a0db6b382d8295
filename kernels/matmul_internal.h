// MatMul's kernels, exposed so that tests and benchmarks can pin one; the engine calls k3::MatMul,
// which picks them itself.
//
// Kernels (all compute y = W x in fp32 with BF16 weights widened exactly, never rounding x):
// - kPortable: plain C++ the compiler may vectorize; used where the CPU lacks AVX-512.
// - kAvx512Rows: dot products of a few weight rows with up to 8 tokens at a time, reducing along
//   the input dimension. Reads W once per 8 tokens straight from memory; for decode (tokens <= 8),
//   where W streams from DRAM and the arithmetic is cheap.
// - kAvx512Tiles: blocked GEMM. A panel of 48 weight rows x 128 inputs is widened and transposed
//   into an L1-resident buffer, then multiplied with every 8-token tile by an outer-product
//   micro-kernel (24 fp32 accumulators, broadcast activations); for prefill.
//
// Why no vdpbf16ps: exact-enough activations need a hi+lo bf16 split (two dot-product instructions
// per 32 multiply-adds), which is exactly the fp32 FMA rate on this hardware, so it would only add
// conversion work and lose the bottom mantissa bits.
#ifndef K3SERVE_KERNELS_MATMUL_INTERNAL_H_
#define K3SERVE_KERNELS_MATMUL_INTERNAL_H_

#include <cstdint>
#include <functional>

#include "kernels/matmul.h"

namespace k3::internal {

enum class MatMulKernel { kAuto, kPortable, kAvx512Rows, kAvx512Tiles };

// Whether the AVX-512 kernels can run here (AVX-512F and BW, checked once at run time).
bool CpuHasAvx512();

// k3::MatMul with a chosen kernel. REQUIRES: CpuHasAvx512() for the kAvx512* kernels.
void MatMulWith(MatMulKernel kernel, const WeightMatrix& w, const float* x, int64_t x_stride,
                int64_t tokens, float* y, int64_t y_stride, bool accumulate);

// The kernels behind MatMulWith, each splitting the output rows across the kernel pool.
// REQUIRES: arguments checked by MatMulWith; tokens, w.rows and w.cols all > 0.
void MatMulPortable(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                    float* y, int64_t y_stride, bool accumulate);
void MatMulAvx512Rows(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                      float* y, int64_t y_stride, bool accumulate);
void MatMulAvx512Tiles(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                       float* y, int64_t y_stride, bool accumulate);

// Calls fn(row_begin, row_end) on ranges covering the rows of `w`, across the kernel pool, each
// starting at a multiple of `align` and holding enough work (for `tokens` tokens) to pay for a
// thread.
void ParallelForRows(const WeightMatrix& w, int64_t tokens, int64_t align,
                     const std::function<void(int64_t, int64_t)>& fn);

// Rows per panel of the tiled kernel.
constexpr int64_t kTileRows = 48;

}  // namespace k3::internal

#endif  // K3SERVE_KERNELS_MATMUL_INTERNAL_H_
