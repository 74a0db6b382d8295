#include "kernels/matmul_transposed.h"

#include <algorithm>
#include <cstring>

#include "glog/logging.h"
#include "kernels/bf16.h"
#include "kernels/fp32_products.h"
#include "kernels/simd.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

K3_VECTOR_CLONES
void WidenBf16(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

// y += alpha · widen(w) for bf16 w, widening in registers.
K3_VECTOR_CLONES
void AxpyBf16(float alpha, const uint16_t* w, float* y, int64_t n) {
  typedef uint16_t U16x16 __attribute__((vector_size(32)));
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    U16x16 half;
    std::memcpy(&half, w + i, sizeof(half));
    const U32x16 bits = __builtin_convertvector(half, U32x16) << 16;
    simd::Vec16 wide;
    std::memcpy(&wide, &bits, sizeof(wide));
    simd::Store(y + i, simd::Load(y + i) + alpha * wide);
  }
  for (; i < n; ++i) y[i] += alpha * Bf16ToFloat(w[i]);
}

}  // namespace

void MatMulTransposed(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                      float* y, int64_t y_stride) {
  CHECK(w.type != WeightType::kMxfp4) << "MatMulTransposed: MXFP4 weights are not supported";
  // Column blocks: each row's slice is widened once into a stack buffer and then applied to every
  // token, and the blocks are independent, so they are the unit of parallel work.
  constexpr int64_t kBlock = 256;
  // Few tokens widen each weight in registers as they use it; more share one widened copy.
  constexpr int64_t kWidenOnceTokens = 2;
  const int64_t blocks = (w.cols + kBlock - 1) / kBlock;
  ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    float row[kBlock];
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t c0 = blk * kBlock;
      const int64_t len = std::min(kBlock, w.cols - c0);
      for (int64_t t = 0; t < tokens; ++t) std::fill_n(y + t * y_stride + c0, len, 0.0f);
      for (int64_t r = 0; r < w.rows; ++r) {
        if (w.type == WeightType::kF32) {
          const float* src = static_cast<const float*>(w.data) + r * w.cols + c0;
          for (int64_t t = 0; t < tokens; ++t) {
            Axpy(x[t * x_stride + r], src, y + t * y_stride + c0, len);
          }
        } else if (tokens <= kWidenOnceTokens) {
          const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * w.cols + c0;
          for (int64_t t = 0; t < tokens; ++t) {
            AxpyBf16(x[t * x_stride + r], src, y + t * y_stride + c0, len);
          }
        } else {
          WidenBf16(static_cast<const uint16_t*>(w.data) + r * w.cols + c0, row, len);
          for (int64_t t = 0; t < tokens; ++t) {
            Axpy(x[t * x_stride + r], row, y + t * y_stride + c0, len);
          }
        }
      }
    }
  });
}

}  // namespace k3
