#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "glog/logging.h"
#include "kernels/bf16.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

// Up to this many tokens the row kernel (one pass over W, no packing) beats the tiled GEMM; the
// two are even at 16 (measured on Zen 5).
constexpr int64_t kRowsKernelMaxTokens = 12;
// MXFP4 weights: the tiled kernel decodes blocks of rows into bf16 first, so the row kernel stays
// ahead longer; the two are even between 32 and 64 tokens (3072 x 3584, weights in cache, Zen 5).
constexpr int64_t kMxfp4RowsKernelMaxTokens = 32;
// Least work (in multiply-adds, weight elements counted at least 4 times for their memory traffic)
// worth handing to another thread: a few microseconds, against about one for a ParallelFor.
constexpr int64_t kMinChunkWork = int64_t{1} << 18;
// Least work (as for kMinChunkWork) worth waking resting kernel threads for (WakeKernelThreads):
// about 2^20 weight bytes, tens of microseconds of one thread.
constexpr int64_t kMinWakeWork = int64_t{1} << 20;
// Inputs per block in the portable kernel: a widened block of one weight row stays in L1.
constexpr int64_t kPortableBlock = 512;

// Sum of a[i] * b[i], in 16 independent partial sums so that the compiler can vectorize it.
float Dot(const float* a, const float* b, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) lanes[j] += a[i] * b[i];
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

}  // namespace

float WeightMatrix::At(int64_t r, int64_t c) const {
  CHECK(r >= 0 && r < rows && c >= 0 && c < cols)
      << "WeightMatrix::At(" << r << ", " << c << ") outside [" << rows << ", " << cols << "]";
  if (type == WeightType::kMxfp4) {
    return Mxfp4Element(static_cast<const uint8_t*>(data) + r * cols / 2,
                        scales + r * cols / kMxfp4Group, c);
  }
  const int64_t index = r * cols + c;
  if (type == WeightType::kBf16) return Bf16ToFloat(static_cast<const uint16_t*>(data)[index]);
  return static_cast<const float*>(data)[index];
}

WeightMatrix WeightMatrix::RowSlice(int64_t first, int64_t count) const {
  CHECK(first >= 0 && count >= 0 && first + count <= rows)
      << "WeightMatrix::RowSlice(" << first << ", " << count << ") outside " << rows << " rows";
  WeightMatrix slice = *this;
  if (type == WeightType::kMxfp4) {
    slice.data = static_cast<const uint8_t*>(data) + first * cols / 2;
    slice.scales = scales + first * cols / kMxfp4Group;
  } else {
    slice.data =
        static_cast<const char*>(data) + first * cols * (type == WeightType::kBf16 ? 2 : 4);
  }
  slice.rows = count;
  return slice;
}

void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens, float* y,
            int64_t y_stride, bool accumulate) {
  internal::MatMulWith(internal::MatMulKernel::kAuto, w, x, x_stride, tokens, y, y_stride,
                       accumulate);
}

void MatMulBatch(const MatMulTask* tasks, int count, int64_t tokens) {
  bool rows_kernel = internal::CpuHasAvx512() && tokens > 0;
  for (int i = 0; i < count && rows_kernel; ++i) {
    const MatMulTask& t = tasks[i];
    CHECK(t.w != nullptr) << "MatMulBatch: task " << i << " has no weights";
    internal::CheckArguments(*t.w, t.x_stride, tokens, t.y_stride);
    rows_kernel = t.w->rows > 0 && t.w->cols > 0 &&
                  tokens <= (t.w->type == WeightType::kMxfp4 ? kMxfp4RowsKernelMaxTokens
                                                            : kRowsKernelMaxTokens);
  }
  if (rows_kernel) {
    internal::MatMulAvx512RowsBatch(tasks, count, tokens);
    return;
  }
  for (int i = 0; i < count; ++i) {
    const MatMulTask& t = tasks[i];
    MatMul(*t.w, t.x, t.x_stride, tokens, t.y, t.y_stride, t.accumulate);
  }
}

namespace internal {

bool CpuHasAvx512() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

namespace {

void PortableRange(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                   float* y, int64_t y_stride, bool accumulate, int64_t row_begin,
                   int64_t row_end) {
  const int64_t cols = w.cols;
  float widened[kPortableBlock];
  std::vector<float> sums(tokens);
  for (int64_t r = row_begin; r < row_end; ++r) {
    std::fill(sums.begin(), sums.end(), 0.0f);
    for (int64_t k0 = 0; k0 < cols; k0 += kPortableBlock) {
      const int64_t len = std::min(kPortableBlock, cols - k0);
      const float* row;
      if (w.type == WeightType::kBf16) {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + r * cols + k0;
        for (int64_t k = 0; k < len; ++k) widened[k] = Bf16ToFloat(src[k]);
        row = widened;
      } else if (w.type == WeightType::kMxfp4) {
        const uint8_t* codes = static_cast<const uint8_t*>(w.data) + r * cols / 2;
        const uint8_t* scales = w.scales + r * cols / kMxfp4Group;
        for (int64_t k = 0; k < len; ++k) widened[k] = Mxfp4Element(codes, scales, k0 + k);
        row = widened;
      } else {
        row = static_cast<const float*>(w.data) + r * cols + k0;
      }
      for (int64_t t = 0; t < tokens; ++t) sums[t] += Dot(row, x + t * x_stride + k0, len);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      float& out = y[t * y_stride + r];
      out = accumulate ? out + sums[t] : sums[t];
    }
  }
}

}  // namespace

void MatMulPortable(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                    float* y, int64_t y_stride, bool accumulate) {
  ParallelForRows(w, tokens, 16, [&](int64_t begin, int64_t end) {
    PortableRange(w, x, x_stride, tokens, y, y_stride, accumulate, begin, end);
  });
}

void ParallelForRows(const WeightMatrix& w, int64_t tokens, int64_t align,
                     const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t blocks = (w.rows + align - 1) / align;
  const int64_t block_work = align * w.cols * std::max<int64_t>(tokens, 4);
  const int64_t grain = std::max<int64_t>(1, kMinChunkWork / block_work);
  if (blocks * block_work >= kMinWakeWork) WakeKernelThreads();
  ParallelFor(blocks, grain, [&](int64_t begin, int64_t end) {
    fn(begin * align, std::min(w.rows, end * align));
  });
}

void CheckArguments(const WeightMatrix& w, int64_t x_stride, int64_t tokens, int64_t y_stride) {
  CHECK(w.rows >= 0 && w.cols >= 0) << "MatMul: bad weight shape [" << w.rows << ", " << w.cols
                                    << "]";
  CHECK_GE(tokens, 0) << "MatMul: negative token count";
  if (tokens == 0 || w.rows == 0) return;
  CHECK(!w.empty()) << "MatMul: weight matrix has no data";
  CHECK(w.type != WeightType::kMxfp4 || (w.scales != nullptr && w.cols % kMxfp4Group == 0))
      << "MatMul: MXFP4 weights need scales and whole groups of " << kMxfp4Group << " inputs";
  CHECK_GE(x_stride, w.cols) << "MatMul: x row stride below the input width";
  CHECK_GE(y_stride, w.rows) << "MatMul: y row stride below the output width";
}

void MatMulWith(MatMulKernel kernel, const WeightMatrix& w, const float* x, int64_t x_stride,
                int64_t tokens, float* y, int64_t y_stride, bool accumulate) {
  CheckArguments(w, x_stride, tokens, y_stride);
  if (tokens == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    if (!accumulate) {
      for (int64_t t = 0; t < tokens; ++t) std::fill_n(y + t * y_stride, w.rows, 0.0f);
    }
    return;
  }

  if (kernel == MatMulKernel::kAuto) {
    if (!CpuHasAvx512()) {
      kernel = MatMulKernel::kPortable;
    } else {
      const int64_t rows_max =
          w.type == WeightType::kMxfp4 ? kMxfp4RowsKernelMaxTokens : kRowsKernelMaxTokens;
      kernel = tokens <= rows_max ? MatMulKernel::kAvx512Rows : MatMulKernel::kAvx512Tiles;
    }
  }
  CHECK(kernel == MatMulKernel::kPortable || CpuHasAvx512())
      << "MatMul: AVX-512 kernel requested on a CPU without AVX-512";

  switch (kernel) {
    case MatMulKernel::kAvx512Rows:
      MatMulAvx512Rows(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
    case MatMulKernel::kAvx512Tiles:
      MatMulAvx512Tiles(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
    default:
      MatMulPortable(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
  }
}

}  // namespace internal
}  // namespace k3
