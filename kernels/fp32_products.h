// Products of fp32 activations with fp32 activations: the dot product, every row against every row
// (attention scores), a small dense GEMM (the mixers' chunk-sized blocks) and y += αx. Products
// with checkpoint weights are kernels/matmul.h.
//
// Written with kernels/simd.h vectors and compiled for AVX-512, AVX2 and baseline x86-64; the
// loader picks one per CPU. Single-threaded: callers parallelize around them.
//
// Thread-safety: pure functions of their arguments.
#ifndef K3SERVE_KERNELS_FP32_PRODUCTS_H_
#define K3SERVE_KERNELS_FP32_PRODUCTS_H_

#include <cstdint>

namespace k3 {

// Σ a[i] · b[i] over n values, in fp32 (four vector accumulators, then the scalar tail).
float Dot(const float* a, const float* b, int64_t n);

// out[i * out_ld + j] = Dot(a + i * a_ld, b + j * b_ld, n) for i < m, j < k: every row of a with
// every row of b (the scores of m heads against k keys). Four rows of a share each load of a b
// row and one combined horizontal reduction, several times faster than m·k Dot calls.
void DotRows(const float* a, int64_t a_ld, int64_t m, const float* b, int64_t b_ld, int64_t k,
             int64_t n, float* out, int64_t out_ld);

// C[m, n] = A[m, k] · B[k, n] (or C += A · B when `accumulate`), every matrix row-major with its
// own row stride. REQUIRES: C overlaps neither A nor B.
void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate);

// y += alpha · x. REQUIRES: x and y do not overlap.
void Axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace k3

#endif  // K3SERVE_KERNELS_FP32_PRODUCTS_H_
