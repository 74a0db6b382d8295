// MatMul's kernels, exposed so that tests and benchmarks can pin one; the engine calls k3::MatMul,
// which picks them itself.
//
// Kernels (all compute y = W x in fp32 with BF16 weights widened exactly, never rounding x):
// - kPortable: plain C++ the compiler may vectorize (baseline x86-64, or any other CPU); MXFP4
//   groups decoded through a 16-entry table times the group's scale.
// - kAvx512Rows: dot products of a block of weight rows with groups of up to 4 tokens, reducing
//   along the input dimension. Reads W once, straight from memory, as a few sequential streams;
//   for decode (up to 12 tokens), where W streams from DRAM and the arithmetic is cheap. Each
//   (row, token) sum runs in the same order whatever the block, group or token count, so batch
//   invariance (base/batch_invariance.h, the default) takes it for every token count.
// - kAvx512Tiles: blocked GEMM. A panel of 48 weight rows x 384 inputs (192 for F32 weights) is
//   transposed into an L1-resident buffer, then multiplied with every 8-token tile by an
//   outer-product micro-kernel (24 fp32 accumulators, broadcast activations); for prefill.
//
// - kAvx2Rows, kAvx2Tiles: the same two designs for AVX2 + FMA (16 ymm registers): row blocks of
//   8 rows for one token (4 for two, 2 for three or four), tiles of 16 rows x 6 tokens (12
//   accumulators) over panels packed as 32-bit units (a bf16 pair, an f32, or an MXFP4 code byte
//   decoded to a bf16 pair).
//
// MXFP4 weights with 8-bit activations (Mxfp4Activations::kInt8, opt-in): one AVX2 row kernel for
// both x86 families (matmul_mxfp4_int8.cc), integer dot products of the codes looked up as small
// integers with the rounded activations, one fp32 multiply-add per group; any token count.
//
// MXFP4 weights: the row kernel decodes each 32-input group in registers (AVX-512: 16 code bytes
// widened to 32-bit lanes, two vpermps lookups in the E2M1 table times the group's scale; AVX2:
// two vpshufb lookups of the 32 codes in tables of the scaled values' bf16 bytes), so decode reads
// only the packed bytes and scales; the tiled kernel decodes blocks of 384 rows once into a bf16
// buffer (exact: MXFP4 values have at most 2 significant bits) and runs the BF16 micro-kernel.
//
// Why per-family intrinsics (and not Google Highway): the kernels' speed comes from choices that
// differ by register file, not only by width (R x T accumulator blocks, 48 x 8 vs 16 x 6 tiles,
// vpermps tables of 16 vs 8 entries with the sign folded in), which a width-agnostic source would
// still spell per target; and the BF16 row kernel, the decode path, is bound by memory on either
// family (one thread 30-35 GB/s with AVX2, 28-34 with AVX-512 in interleaved runs), so there is no
// speed for a library to add. Element-wise loops elsewhere use kernels/simd.h's Vec16 clones.
//
// Why no vdpbf16ps: its bf16 x bf16 products need bf16 activations. Keeping them exact enough
// takes a hi + lo split of each activation and two dot-product instructions per 32 multiply-adds,
// the same instruction count as fp32 FMA on this hardware (vdpbf16ps and vfmadd231ps issue at the
// same rate on Zen 5), so it would add conversion work and still lose the bottom mantissa bits.
// The fp32 FMA rate is therefore the ceiling: half the bf16 peak.
#ifndef K3SERVE_KERNELS_MATMUL_INTERNAL_H_
#define K3SERVE_KERNELS_MATMUL_INTERNAL_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>

#include "kernels/kernel_isa.h"
#include "kernels/matmul.h"

namespace k3::internal {

enum class MatMulKernel { kAuto, kPortable, kAvx512Rows, kAvx512Tiles, kAvx2Rows, kAvx2Tiles };

// The instruction-set family a kernel needs.
KernelIsa IsaOf(MatMulKernel kernel);

// Whether the AVX-512 kernels can run here (AVX-512F and BW, checked once at run time).
bool CpuHasAvx512();

// MatMul's argument checks (a CHECK failure names the bad one).
void CheckArguments(const WeightMatrix& w, int64_t x_stride, int64_t tokens, int64_t y_stride);

// k3::MatMul with a chosen kernel (kAuto: ActiveKernelIsa()'s family).
// REQUIRES: CpuSupports(IsaOf(kernel)).
void MatMulWith(MatMulKernel kernel, const WeightMatrix& w, const float* x, int64_t x_stride,
                int64_t tokens, float* y, int64_t y_stride, bool accumulate);

// The kernels behind MatMulWith, each splitting the output rows across the kernel pool.
// REQUIRES: arguments checked by MatMulWith; tokens, w.rows and w.cols all > 0.
void MatMulPortable(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                    float* y, int64_t y_stride, bool accumulate);
void MatMulAvx512Tiles(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                       float* y, int64_t y_stride, bool accumulate);
void MatMulAvx2Tiles(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                     float* y, int64_t y_stride, bool accumulate);

// One family's row kernel, driven by RowsBatch.
struct RowKernel {
  // Packs `tokens` activation rows for the BF16 and MXFP4 rows: each block of 32 inputs as its 16
  // even then its 16 odd inputs, zero-padded to padded_cols (a multiple of 32); 64-byte aligned.
  void (*pack_inputs)(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                      int64_t padded_cols, float* packed);
  // Packs them for the MXFP4 rows, in the order that family's MXFP4 kernel reads them (a
  // permutation within each 32-input block; AVX-512: pack_inputs's).
  void (*pack_mxfp4_inputs)(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                            int64_t padded_cols, float* packed);
  // y rows [row_begin, row_end) of w for every token: xp[t] is token t's activations (packed for
  // BF16 and MXFP4, as given for F32), yt[t] its output row.
  void (*rows)(const WeightMatrix& w, const float* const* xp, float* const* yt, int64_t tokens,
               bool accumulate, int64_t row_begin, int64_t row_end);
};
const RowKernel& Avx512RowKernel();
const RowKernel& Avx2RowKernel();

// MXFP4 rows with 8-bit activations (Mxfp4Activations::kInt8; matmul_mxfp4_int8.cc), the AVX2
// kernel both x86 families use: QuantizeMxfp4Inputs writes `tokens` rows of activations, each as
// Mxfp4Int8Bytes(cols) bytes (a multiple of 128) at packed + t * Mxfp4Int8Bytes(cols) (64-byte
// aligned); Mxfp4Int8Rows is RowKernel::rows for MXFP4 weights on them (xp[t]: token t's bytes).
// REQUIRES: cols % kMxfp4Group == 0; Mxfp4Int8Rows: CpuSupports(KernelIsa::kAvx2).
int64_t Mxfp4Int8Bytes(int64_t cols);
void QuantizeMxfp4Inputs(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                         void* packed);
void Mxfp4Int8Rows(const WeightMatrix& w, const float* const* xp, float* const* yt,
                   int64_t tokens, bool accumulate, int64_t row_begin, int64_t row_end);

// Rows handed to a thread at a time by RowsBatch: a multiple of every family's rows per block.
constexpr int64_t kRowsAlign = 8;

// Every task through one row kernel, as one job of the kernel pool (MatMulBatch). REQUIRES: each
// task checked by MatMulWith; tokens > 0 and every task's rows and cols > 0.
void RowsBatch(const RowKernel& kernel, const MatMulTask* tasks, int count, int64_t tokens);

// k3::MatMulBatch on a chosen family. REQUIRES: CpuSupports(isa).
void MatMulBatchOn(KernelIsa isa, const MatMulTask* tasks, int count, int64_t tokens);

// Calls fn(row_begin, row_end) on ranges covering the rows of `w`, across the kernel pool, each
// starting at a multiple of `align` and holding enough work (for `tokens` tokens) to pay for a
// thread.
void ParallelForRows(const WeightMatrix& w, int64_t tokens, int64_t align,
                     const std::function<void(int64_t, int64_t)>& fn);

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
// A per-thread buffer that grows to the largest size asked of it.
class ThreadBuffer {
 public:
  float* Get(size_t floats) {
    if (floats > capacity_) {
      const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      capacity_ = floats;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<float, FreeDeleter> data_;
  size_t capacity_ = 0;
};

// Rows per panel of the tiled kernel.
constexpr int64_t kTileRows = 48;

}  // namespace k3::internal

#endif  // K3SERVE_KERNELS_MATMUL_INTERNAL_H_
