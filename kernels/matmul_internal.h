// MatMul's kernels, exposed so that tests and benchmarks can pin one; the engine calls k3::MatMul,
// which picks them itself.
//
// Kernels (all compute y = W x in fp32 with BF16 weights widened exactly, never rounding x):
// - kPortable: plain C++ the compiler may vectorize; used where the CPU lacks AVX-512.
// - kAvx512Rows: dot products of a block of weight rows with groups of up to 4 tokens, reducing
//   along the input dimension. Reads W once, straight from memory, as a few sequential streams;
//   for decode (up to 12 tokens), where W streams from DRAM and the arithmetic is cheap.
// - kAvx512Tiles: blocked GEMM. A panel of 48 weight rows x 384 inputs (192 for F32 weights) is
//   transposed into an L1-resident buffer, then multiplied with every 8-token tile by an
//   outer-product micro-kernel (24 fp32 accumulators, broadcast activations); for prefill.
//
// MXFP4 weights: the row kernel decodes each 32-input group in registers (16 code bytes widened to
// 32-bit lanes, two vpermps lookups in the E2M1 table times the group's scale), so decode reads
// only the packed bytes and scales; the tiled kernel decodes blocks of 384 rows once into a bf16
// buffer (exact: MXFP4 values have at most 2 significant bits) and runs the BF16 micro-kernel.
//
// Why no vdpbf16ps: its bf16 x bf16 products need bf16 activations. Keeping them exact enough
// takes a hi + lo split of each activation and two dot-product instructions per 32 multiply-adds,
// the same instruction count as fp32 FMA on this hardware (vdpbf16ps and vfmadd231ps issue at the
// same rate on Zen 5), so it would add conversion work and still lose the bottom mantissa bits.
// The fp32 FMA rate is therefore the ceiling: half the bf16 peak.
#ifndef K3SERVE_KERNELS_MATMUL_INTERNAL_H_
#define K3SERVE_KERNELS_MATMUL_INTERNAL_H_

#include <cstdint>
#include <functional>

#include "kernels/matmul.h"

namespace k3::internal {

enum class MatMulKernel { kAuto, kPortable, kAvx512Rows, kAvx512Tiles };

// Whether the AVX-512 kernels can run here (AVX-512F and BW, checked once at run time).
bool CpuHasAvx512();

// MatMul's argument checks (a CHECK failure names the bad one).
void CheckArguments(const WeightMatrix& w, int64_t x_stride, int64_t tokens, int64_t y_stride);

// k3::MatMul with a chosen kernel. REQUIRES: CpuHasAvx512() for the kAvx512* kernels.
void MatMulWith(MatMulKernel kernel, const WeightMatrix& w, const float* x, int64_t x_stride,
                int64_t tokens, float* y, int64_t y_stride, bool accumulate);

// The kernels behind MatMulWith, each splitting the output rows across the kernel pool.
// REQUIRES: arguments checked by MatMulWith; tokens, w.rows and w.cols all > 0.
void MatMulPortable(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                    float* y, int64_t y_stride, bool accumulate);
void MatMulAvx512Rows(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                      float* y, int64_t y_stride, bool accumulate);
// The row kernel over several products (MatMulBatch). REQUIRES: each task checked by MatMulWith.
void MatMulAvx512RowsBatch(const MatMulTask* tasks, int count, int64_t tokens);
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
