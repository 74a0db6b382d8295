// Matrix products of activations (fp32) with checkpoint weights (BF16, F32 or MXFP4), the engine's
// hot path.
//
// Weights are `Linear` weights stored [out, in] row-major (y = W x), usually pointing straight into
// a memory-mapped checkpoint: a WeightMatrix never owns its data. BF16 weights are widened to fp32
// in registers, MXFP4 weights (kernels/mxfp4.h) decoded there through a 16-entry table scaled by
// their group's power of two (AVX-512 where the CPU has it, chosen at run time; a portable loop
// elsewhere). Accumulation is fp32. Products are split across the kernel thread pool
// (kernels/thread_pool.h). The transposed product Wᵀ x is kernels/matmul_transposed.h; products of
// activations with activations are kernels/fp32_products.h.
#ifndef K3SERVE_KERNELS_MATMUL_H_
#define K3SERVE_KERNELS_MATMUL_H_

#include <cstdint>

namespace k3 {

enum class WeightType : uint8_t { kBf16, kF32, kMxfp4 };

struct WeightMatrix {
  const void* data = nullptr;  // not owned; [rows, cols] row-major, no padding (kMxfp4: the codes,
                               // [rows, cols / 2] bytes)
  WeightType type = WeightType::kBf16;
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features; kMxfp4: a multiple of kMxfp4Group
  const uint8_t* scales = nullptr;  // kMxfp4 only, not owned: E8M0 bytes [rows, cols / 32], no 255

  bool empty() const { return data == nullptr; }
  // Element (r, c) as float; for slow paths and tests.
  float At(int64_t r, int64_t c) const;
  // A view of rows [first, first + count).
  WeightMatrix RowSlice(int64_t first, int64_t count) const;
};

// y[t, :] = W x[t, :] for t in [0, tokens).
// x: [tokens, W.cols] with row stride x_stride (>= W.cols); y: [tokens, W.rows] with row stride
// y_stride (>= W.rows). When `accumulate` is true, y += W x instead of y = W x.
// REQUIRES: x and y do not overlap.
void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens, float* y,
            int64_t y_stride, bool accumulate = false);

// One product of a MatMulBatch: y[t, :] (+)= W x[t, :], strides as for MatMul.
struct MatMulTask {
  const WeightMatrix* w = nullptr;  // not owned
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  bool accumulate = false;
};

// Every task for the same `tokens`, as one job of the kernel pool where the row kernel serves them
// (decode): the threads split the tasks' weight bytes evenly between them, instead of meeting
// after each small product. Results are those of MatMul, task by task.
// REQUIRES: no task's y overlaps another task's x or y.
void MatMulBatch(const MatMulTask* tasks, int count, int64_t tokens);

// How MXFP4 products (up to any token count on x86 with AVX2; the portable kernel is always kFp32)
// treat their activations:
// - kFp32 (the default): as every other product, exactly; the codes are decoded to fp32 in
//   registers. On AVX2 this is bound by the core's shuffles and shifts, not by memory.
// - kInt8 (opt-in, K3SERVE_MXFP4_ACTIVATIONS=int8): each group of 32 inputs of a token is rounded
//   to 8 bits with one fp32 step (its largest magnitude / 127, as llama.cpp's Q8 activations do)
//   and multiplied with the codes by integer dot products, about half the instructions: the error
//   of each input is at most a 254th of its group's largest magnitude. Every MXFP4 product then
//   runs the row kernel, so a (row, token) sum does not depend on the call's token count.
enum class Mxfp4Activations { kFp32, kInt8 };

// The process's mode: K3SERVE_MXFP4_ACTIVATIONS=fp32|int8 read on first use of either function
// (anything else is logged as an error and ignored); SetMxfp4Activations overrides it. Thread-safe.
Mxfp4Activations ActiveMxfp4Activations();
// Sets the mode for products started afterwards (tests and benchmarks compare the two).
void SetMxfp4Activations(Mxfp4Activations mode);

// Convenience for densely packed rows.
inline void MatMul(const WeightMatrix& w, const float* x, int64_t tokens, float* y) {
  MatMul(w, x, w.cols, tokens, y, w.rows, false);
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_MATMUL_H_
