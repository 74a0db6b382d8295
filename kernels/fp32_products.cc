#include "kernels/fp32_products.h"

#include <algorithm>

#include "kernels/simd.h"

namespace k3 {

using simd::kWidth;
using simd::Load;
using simd::Splat;
using simd::Store;
using simd::Vec16;

K3_VECTOR_CLONES
float Dot(const float* a, const float* b, int64_t n) {
  // Four independent chains hide the FMA latency.
  Vec16 acc0{}, acc1{}, acc2{}, acc3{};
  int64_t i = 0;
  for (; i + 4 * kWidth <= n; i += 4 * kWidth) {
    acc0 += Load(a + i) * Load(b + i);
    acc1 += Load(a + i + kWidth) * Load(b + i + kWidth);
    acc2 += Load(a + i + 2 * kWidth) * Load(b + i + 2 * kWidth);
    acc3 += Load(a + i + 3 * kWidth) * Load(b + i + 3 * kWidth);
  }
  for (; i + kWidth <= n; i += kWidth) acc0 += Load(a + i) * Load(b + i);
  float sum = simd::Sum((acc0 + acc1) + (acc2 + acc3));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

namespace {

// The horizontal reductions of DotRows, several accumulators at once (forced inline: they run
// inside DotRows' clones). Quarters: lanes 4q..4q+3 hold four partial sums of the q-th argument.
K3_SIMD_INLINE Vec16 Quarters(Vec16 p, Vec16 q, Vec16 r, Vec16 s) {
  const Vec16 pq =
      __builtin_shufflevector(p, q, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(p, q, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const Vec16 rs =
      __builtin_shufflevector(r, s, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(r, s, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  return __builtin_shufflevector(pq, rs, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                                 27) +
         __builtin_shufflevector(pq, rs, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                 31);
}
// Of two Quarters results: lanes 2i, 2i+1 hold two partial sums of the i-th sum (p's four, then
// q's four).
K3_SIMD_INLINE Vec16 Halves(Vec16 p, Vec16 q) {
  return __builtin_shufflevector(p, q, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         __builtin_shufflevector(p, q, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
// Of two Halves results: lane i holds the i-th sum (p's eight, then q's eight).
K3_SIMD_INLINE Vec16 Totals(Vec16 p, Vec16 q) {
  return __builtin_shufflevector(p, q, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                 30) +
         __builtin_shufflevector(p, q, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

}  // namespace

K3_VECTOR_CLONES
void DotRows(const float* a, int64_t a_ld, int64_t m, const float* b, int64_t b_ld, int64_t k,
             int64_t n, float* out, int64_t out_ld) {
  const int64_t vec_n = n - n % kWidth;
  int64_t i0 = 0;
  for (; i0 + 4 <= m; i0 += 4) {
    const float* rows[4] = {a + i0 * a_ld, a + (i0 + 1) * a_ld, a + (i0 + 2) * a_ld,
                            a + (i0 + 3) * a_ld};
    const float* a0 = rows[0];
    const float* a1 = rows[1];
    const float* a2 = rows[2];
    const float* a3 = rows[3];
    // Dot products the vector loop left out (n not a multiple of the vector width).
    auto tail = [&](int h, const float* col, float sum) {
      for (int64_t d = vec_n; d < n; ++d) sum += rows[h][d] * col[d];
      return sum;
    };
    int64_t j = 0;
    // Four rows of b at a time: each load of a feeds four FMAs (the loads, not the FMAs, bound
    // the one-row loop), and one transposing reduction turns the 16 accumulators into one
    // vector of the 16 dot products.
    for (; j + 4 <= k; j += 4) {
      const float* cols[4] = {b + j * b_ld, b + (j + 1) * b_ld, b + (j + 2) * b_ld,
                              b + (j + 3) * b_ld};
      Vec16 s00{}, s01{}, s02{}, s03{}, s10{}, s11{}, s12{}, s13{};  // s<row of a><row of b>
      Vec16 s20{}, s21{}, s22{}, s23{}, s30{}, s31{}, s32{}, s33{};
      for (int64_t d = 0; d < vec_n; d += kWidth) {
        const Vec16 x0 = Load(cols[0] + d), x1 = Load(cols[1] + d), x2 = Load(cols[2] + d),
                    x3 = Load(cols[3] + d);
        const Vec16 y0 = Load(a0 + d), y1 = Load(a1 + d), y2 = Load(a2 + d), y3 = Load(a3 + d);
        s00 += y0 * x0, s01 += y0 * x1, s02 += y0 * x2, s03 += y0 * x3;
        s10 += y1 * x0, s11 += y1 * x1, s12 += y1 * x2, s13 += y1 * x3;
        s20 += y2 * x0, s21 += y2 * x1, s22 += y2 * x2, s23 += y2 * x3;
        s30 += y3 * x0, s31 += y3 * x1, s32 += y3 * x2, s33 += y3 * x3;
      }
      // Lane 4c + h: row h of a with row c of b.
      const Vec16 f =
          Totals(Halves(Quarters(s00, s10, s20, s30), Quarters(s01, s11, s21, s31)),
                 Halves(Quarters(s02, s12, s22, s32), Quarters(s03, s13, s23, s33)));
      for (int c = 0; c < 4; ++c) {
        for (int h = 0; h < 4; ++h) out[(i0 + h) * out_ld + j + c] = tail(h, cols[c], f[4 * c + h]);
      }
    }
    for (; j < k; ++j) {
      const float* bj = b + j * b_ld;
      Vec16 s0{}, s1{}, s2{}, s3{};
      for (int64_t d = 0; d < vec_n; d += kWidth) {
        const Vec16 x = Load(bj + d);
        s0 += Load(a0 + d) * x;
        s1 += Load(a1 + d) * x;
        s2 += Load(a2 + d) * x;
        s3 += Load(a3 + d) * x;
      }
      // Lanes 0..3: the four dot products.
      const Vec16 t = Quarters(s0, s1, s2, s3);
      const Vec16 e = Halves(t, t);
      const Vec16 f = Totals(e, e);
      for (int h = 0; h < 4; ++h) out[(i0 + h) * out_ld + j] = tail(h, bj, f[h]);
    }
  }
  for (; i0 < m; ++i0) {
    for (int64_t j = 0; j < k; ++j) out[i0 * out_ld + j] = Dot(a + i0 * a_ld, b + j * b_ld, n);
  }
}

K3_VECTOR_CLONES
void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate) {
  // Register blocks of 4 rows x 32 columns: every B load feeds 4 FMAs, every A broadcast 2.
  constexpr int64_t kRows = 4, kCols = 2 * kWidth;
  int64_t i0 = 0;
  for (; i0 + kRows <= m; i0 += kRows) {
    int64_t j0 = 0;
    for (; j0 + kCols <= n; j0 += kCols) {
      // Named accumulators: an array would live on the stack.
      Vec16 c00{}, c01{}, c10{}, c11{}, c20{}, c21{}, c30{}, c31{};
      const float* a0 = a + i0 * lda;
      const float* a1 = a0 + lda;
      const float* a2 = a1 + lda;
      const float* a3 = a2 + lda;
      for (int64_t kk = 0; kk < k; ++kk) {
        const Vec16 b0 = Load(b + kk * ldb + j0), b1 = Load(b + kk * ldb + j0 + kWidth);
        const Vec16 x0 = Splat(a0[kk]), x1 = Splat(a1[kk]), x2 = Splat(a2[kk]), x3 = Splat(a3[kk]);
        c00 += x0 * b0;
        c01 += x0 * b1;
        c10 += x1 * b0;
        c11 += x1 * b1;
        c20 += x2 * b0;
        c21 += x2 * b1;
        c30 += x3 * b0;
        c31 += x3 * b1;
      }
      float* cr = c + i0 * ldc + j0;
      if (accumulate) {
        c00 += Load(cr);
        c01 += Load(cr + kWidth);
        c10 += Load(cr + ldc);
        c11 += Load(cr + ldc + kWidth);
        c20 += Load(cr + 2 * ldc);
        c21 += Load(cr + 2 * ldc + kWidth);
        c30 += Load(cr + 3 * ldc);
        c31 += Load(cr + 3 * ldc + kWidth);
      }
      Store(cr, c00);
      Store(cr + kWidth, c01);
      Store(cr + ldc, c10);
      Store(cr + ldc + kWidth, c11);
      Store(cr + 2 * ldc, c20);
      Store(cr + 2 * ldc + kWidth, c21);
      Store(cr + 3 * ldc, c30);
      Store(cr + 3 * ldc + kWidth, c31);
    }
    if (j0 < n) {  // column tail of this row block, one row at a time below
      for (int64_t r = i0; r < i0 + kRows; ++r) {
        for (int64_t j = j0; j < n; ++j) {
          float sum = accumulate ? c[r * ldc + j] : 0.0f;
          for (int64_t kk = 0; kk < k; ++kk) sum += a[r * lda + kk] * b[kk * ldb + j];
          c[r * ldc + j] = sum;
        }
      }
    }
  }
  for (int64_t r = i0; r < m; ++r) {  // row tail
    float* cr = c + r * ldc;
    if (!accumulate) std::fill_n(cr, n, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float ar = a[r * lda + kk];
      const float* bk = b + kk * ldb;
      int64_t j = 0;
      for (; j + kWidth <= n; j += kWidth) Store(cr + j, Load(cr + j) + ar * Load(bk + j));
      for (; j < n; ++j) cr[j] += ar * bk[j];
    }
  }
}

K3_VECTOR_CLONES
void Axpy(float alpha, const float* __restrict x, float* __restrict y, int64_t n) {
  const Vec16 va = Splat(alpha);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(y + i, Load(y + i) + va * Load(x + i));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace k3
