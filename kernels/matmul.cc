#include "kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "base/batch_invariance.h"
#include "glog/logging.h"
#include "kernels/bf16.h"
#include "kernels/fp32_products.h"
#include "kernels/kernel_isa.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/step_profile.h"
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
// Least weight bytes worth handing to another thread (a few microseconds of streaming, against
// about one for a ParallelFor).
constexpr int64_t kMinChunkBytes = int64_t{64} << 10;
// Least weight bytes worth waking resting kernel threads for (WakeKernelThreads): tens of
// microseconds of one thread's streaming, about what waking a blocked thread can cost.
constexpr int64_t kMinWakeBytes = int64_t{1} << 20;
// Weight bytes of the units a thread takes from another's share when its own is done.
constexpr int64_t kUnitBytes = int64_t{32} << 10;
// Inputs per block in the portable kernel: a widened block of one weight row stays in L1.
constexpr int64_t kPortableBlock = 512;

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
  const ScopedStepPart profile(StepPart::kProducts);
  internal::MatMulWith(internal::MatMulKernel::kAuto, w, x, x_stride, tokens, y, y_stride,
                       accumulate);
}

void MatMulBatch(const MatMulTask* tasks, int count, int64_t tokens) {
  const ScopedStepPart profile(StepPart::kProducts);
  internal::MatMulBatchOn(ActiveKernelIsa(), tasks, count, tokens);
}

namespace {

Mxfp4Activations Mxfp4ActivationsFromEnv() {
  const char* env = std::getenv("K3SERVE_MXFP4_ACTIVATIONS");
  Mxfp4Activations mode = Mxfp4Activations::kFp32;
  if (env != nullptr && *env != '\0') {
    if (std::string_view(env) == "int8") {
      mode = Mxfp4Activations::kInt8;
    } else if (std::string_view(env) != "fp32") {
      LOG(ERROR) << "K3SERVE_MXFP4_ACTIVATIONS=" << env << " is not one of fp32, int8; ignored";
    }
  }
  LOG(INFO) << "MXFP4 activations: " << (mode == Mxfp4Activations::kInt8 ? "int8" : "fp32");
  return mode;
}

std::atomic<Mxfp4Activations>& Mxfp4ActivationsMode() {
  static std::atomic<Mxfp4Activations> mode{Mxfp4ActivationsFromEnv()};
  return mode;
}

}  // namespace

Mxfp4Activations ActiveMxfp4Activations() {
  return Mxfp4ActivationsMode().load(std::memory_order_relaxed);
}

void SetMxfp4Activations(Mxfp4Activations mode) {
  Mxfp4ActivationsMode().store(mode, std::memory_order_relaxed);
}

namespace internal {
namespace {

// Whether the row kernel serves `tokens` tokens through weights of `type`. Batch invariant
// (base/batch_invariance.h): always, since its sum for each (row, token) does not depend on how
// many tokens share the call, while the tiled kernel sums in another order. On this AVX2 host
// (Zen 3, 2 threads, bf16 1024-7168 inputs, 16-256 tokens) the row kernel also measured faster.
// MXFP4 with 8-bit activations: always too, since only the row kernel takes them.
bool UsesRowKernel(WeightType type, int64_t tokens) {
  if (BatchInvariant()) return true;
  if (type != WeightType::kMxfp4) return tokens <= kRowsKernelMaxTokens;
  return ActiveMxfp4Activations() == Mxfp4Activations::kInt8 ||
         tokens <= kMxfp4RowsKernelMaxTokens;
}

// The kernel of family `isa` for `tokens` tokens through weights of `type`.
MatMulKernel KernelFor(KernelIsa isa, WeightType type, int64_t tokens) {
  const bool rows = UsesRowKernel(type, tokens);
  switch (isa) {
    case KernelIsa::kAvx512: return rows ? MatMulKernel::kAvx512Rows : MatMulKernel::kAvx512Tiles;
    case KernelIsa::kAvx2: return rows ? MatMulKernel::kAvx2Rows : MatMulKernel::kAvx2Tiles;
    default: return MatMulKernel::kPortable;
  }
}

}  // namespace

void MatMulBatchOn(KernelIsa isa, const MatMulTask* tasks, int count, int64_t tokens) {
  CHECK(CpuSupports(isa)) << "MatMulBatch: " << KernelIsaName(isa) << " kernels on a CPU without";
  bool rows_kernel = isa != KernelIsa::kPortable && tokens > 0;
  for (int i = 0; i < count && rows_kernel; ++i) {
    const MatMulTask& t = tasks[i];
    CHECK(t.w != nullptr) << "MatMulBatch: task " << i << " has no weights";
    internal::CheckArguments(*t.w, t.x_stride, tokens, t.y_stride);
    rows_kernel = t.w->rows > 0 && t.w->cols > 0 && UsesRowKernel(t.w->type, tokens);
  }
  if (rows_kernel) {
    RowsBatch(isa == KernelIsa::kAvx512 ? Avx512RowKernel() : Avx2RowKernel(), tasks, count,
              tokens);
    return;
  }
  for (int i = 0; i < count; ++i) {
    const MatMulTask& t = tasks[i];
    MatMulWith(KernelFor(isa, t.w->type, tokens), *t.w, t.x, t.x_stride, tokens, t.y, t.y_stride,
               t.accumulate);
  }
}

bool CpuHasAvx512() { return CpuSupports(KernelIsa::kAvx512); }

KernelIsa IsaOf(MatMulKernel kernel) {
  switch (kernel) {
    case MatMulKernel::kAvx512Rows:
    case MatMulKernel::kAvx512Tiles: return KernelIsa::kAvx512;
    case MatMulKernel::kAvx2Rows:
    case MatMulKernel::kAvx2Tiles: return KernelIsa::kAvx2;
    default: return KernelIsa::kPortable;
  }
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
        // One scale per group of 32 (k0 and len are multiples of it), then table lookups.
        const uint8_t* codes = static_cast<const uint8_t*>(w.data) + (r * cols + k0) / 2;
        const uint8_t* scales = w.scales + (r * cols + k0) / kMxfp4Group;
        for (int64_t g = 0; g < len; g += kMxfp4Group) {
          const float scale = E8m0Scale(scales[g / kMxfp4Group]);
          for (int64_t i = 0; i < kMxfp4Group / 2; ++i) {
            const uint8_t byte = codes[g / 2 + i];
            widened[g + 2 * i] = kE2m1Values[byte & 0xf] * scale;
            widened[g + 2 * i + 1] = kE2m1Values[byte >> 4] * scale;
          }
        }
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

  if (kernel == MatMulKernel::kAuto) kernel = KernelFor(ActiveKernelIsa(), w.type, tokens);
  CHECK(CpuSupports(IsaOf(kernel))) << "MatMul: " << KernelIsaName(IsaOf(kernel))
                                    << " kernel requested on a CPU without it";

  switch (kernel) {
    case MatMulKernel::kAvx512Rows:
    case MatMulKernel::kAvx2Rows: {
      const MatMulTask task{&w, x, x_stride, y, y_stride, accumulate};
      RowsBatch(kernel == MatMulKernel::kAvx512Rows ? Avx512RowKernel() : Avx2RowKernel(), &task,
                1, tokens);
      break;
    }
    case MatMulKernel::kAvx512Tiles:
      MatMulAvx512Tiles(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
    case MatMulKernel::kAvx2Tiles:
      MatMulAvx2Tiles(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
    default:
      MatMulPortable(w, x, x_stride, tokens, y, y_stride, accumulate);
      break;
  }
}

void RowsBatch(const RowKernel& kernel, const MatMulTask* tasks, int count, int64_t tokens) {
  // Per task: its activation rows as the kernel reads them, and its output rows.
  struct Prepared {
    std::vector<const float*> xp;
    std::vector<float*> yt;
    int64_t blocks = 0;       // of kRowsAlign rows
    int64_t block_bytes = 0;  // weight bytes of one block (MXFP4 rounded down: codes + scales)
    bool int8 = false;        // MXFP4 with 8-bit activations (Mxfp4Int8Rows)
  };
  // The caller's thread-local copies, captured by reference for the pool's threads (a lambda
  // naming a thread_local would read the running thread's own, empty one).
  thread_local std::vector<Prepared> t_prepared;
  thread_local ThreadBuffer t_buffer;
  std::vector<Prepared>& prepared = t_prepared;
  ThreadBuffer& buffer = t_buffer;
  prepared.resize(count);
  const bool int8 = ActiveMxfp4Activations() == Mxfp4Activations::kInt8;
  // Floats of one token's packed activations for task i (0: read in place).
  auto packed_width = [&](int i) -> int64_t {
    const WeightMatrix& w = *tasks[i].w;
    if (w.type == WeightType::kF32) return 0;
    if (w.type == WeightType::kMxfp4 && int8) return Mxfp4Int8Bytes(w.cols) / 4;
    return (w.cols + 31) / 32 * 32;
  };
  // The earlier task whose packed activations task i can share (same x, stride, width and type:
  // a gated MLP's gate and up, a mixer's projections), or -1.
  auto same_packing = [&](int i) {
    for (int j = 0; j < i; ++j) {
      if (tasks[j].x == tasks[i].x && tasks[j].x_stride == tasks[i].x_stride &&
          tasks[j].w->cols == tasks[i].w->cols && tasks[j].w->type == tasks[i].w->type) {
        return j;
      }
    }
    return -1;
  };
  int64_t packed_floats = 0;
  for (int i = 0; i < count; ++i) packed_floats += tokens * packed_width(i);
  float* packed = buffer.Get(packed_floats);
  int64_t total_bytes = 0;
  for (int i = 0; i < count; ++i) {
    const MatMulTask& task = tasks[i];
    const WeightMatrix& w = *task.w;
    Prepared& p = prepared[i];
    p.xp.resize(tokens);
    p.yt.resize(tokens);
    p.int8 = w.type == WeightType::kMxfp4 && int8;
    for (int64_t t = 0; t < tokens; ++t) p.yt[t] = task.y + t * task.y_stride;
    const int earlier = w.type == WeightType::kF32 ? -1 : same_packing(i);
    if (w.type == WeightType::kF32) {
      for (int64_t t = 0; t < tokens; ++t) p.xp[t] = task.x + t * task.x_stride;
    } else if (earlier >= 0) {
      p.xp = prepared[earlier].xp;
    } else if (p.int8) {
      QuantizeMxfp4Inputs(task.x, task.x_stride, tokens, w.cols, packed);
      const int64_t width = packed_width(i);
      for (int64_t t = 0; t < tokens; ++t) p.xp[t] = packed + t * width;
      packed += tokens * width;
    } else {
      // BF16 and MXFP4 read 32-input blocks, permuted as the kernel reads them (MXFP4: cols % 32
      // == 0).
      const int64_t padded_cols = (w.cols + 31) / 32 * 32;
      const auto pack =
          w.type == WeightType::kMxfp4 ? kernel.pack_mxfp4_inputs : kernel.pack_inputs;
      pack(task.x, task.x_stride, tokens, w.cols, padded_cols, packed);
      for (int64_t t = 0; t < tokens; ++t) p.xp[t] = packed + t * padded_cols;
      packed += tokens * padded_cols;
    }
    p.blocks = (w.rows + kRowsAlign - 1) / kRowsAlign;
    const int64_t elements = kRowsAlign * w.cols;
    p.block_bytes = w.type == WeightType::kF32    ? 4 * elements
                    : w.type == WeightType::kBf16 ? 2 * elements
                                                  : elements / 2 + elements / kMxfp4Group;
    total_bytes += p.blocks * p.block_bytes;
  }
  auto run_rows = [&](int i, int64_t begin, int64_t end) {
    (prepared[i].int8 ? Mxfp4Int8Rows : kernel.rows)(*tasks[i].w, prepared[i].xp.data(),
                                                     prepared[i].yt.data(), tokens,
                                                     tasks[i].accumulate, begin, end);
  };
  // One share of equal weight bytes per thread (whole blocks: block j of a task goes to the share
  // holding its first byte), at least kMinChunkBytes each, cut into units of about kUnitBytes.
  // A thread works through its own share from the front, one contiguous stream, then takes units
  // from the back of the others' shares: a thread that started late or was slowed down does not
  // hold up the whole job.
  const int64_t shares =
      std::clamp<int64_t>(total_bytes / kMinChunkBytes, 1, KernelThreadCount());
  if (total_bytes >= kMinWakeBytes) WakeKernelThreads();
  struct Unit {
    int task;
    int64_t row_begin, row_end;
  };
  thread_local std::vector<Unit> t_units;
  thread_local std::vector<int64_t> t_share_start;
  thread_local std::unique_ptr<std::atomic<uint64_t>[]> t_cursors;
  thread_local int64_t t_cursor_capacity = 0;
  std::vector<Unit>& units = t_units;
  std::vector<int64_t>& share_start = t_share_start;
  units.clear();
  share_start.assign(shares + 1, 0);
  for (int64_t c = 0; c < shares; ++c) {
    share_start[c] = static_cast<int64_t>(units.size());
    const int64_t lo = total_bytes * c / shares, hi = total_bytes * (c + 1) / shares;
    int64_t base = 0;
    for (int i = 0; i < count; ++i) {
      const Prepared& p = prepared[i];
      const int64_t size = p.blocks * p.block_bytes;
      if (base < hi && base + size > lo) {
        const int64_t b0 = lo <= base ? 0 : (lo - base + p.block_bytes - 1) / p.block_bytes;
        const int64_t b1 = std::min(p.blocks, (hi - base + p.block_bytes - 1) / p.block_bytes);
        const int64_t step = std::max<int64_t>(1, kUnitBytes / p.block_bytes);
        for (int64_t b = b0; b < b1; b += step) {
          units.push_back(Unit{i, b * kRowsAlign,
                               std::min(tasks[i].w->rows, std::min(b1, b + step) * kRowsAlign)});
        }
      }
      base += size;
    }
  }
  share_start[shares] = static_cast<int64_t>(units.size());
  if (t_cursor_capacity < shares) {
    t_cursors.reset(new std::atomic<uint64_t>[shares]);
    t_cursor_capacity = shares;
  }
  // Share c's next unit from the front (high 32 bits) and one past its last from the back.
  std::atomic<uint64_t>* cursors = t_cursors.get();
  for (int64_t c = 0; c < shares; ++c) {
    cursors[c].store(static_cast<uint64_t>(share_start[c]) << 32 |
                         static_cast<uint64_t>(share_start[c + 1]),
                     std::memory_order_relaxed);
  }
  // Takes a unit of share c from the front or the back; false when none is left.
  auto take = [&](int64_t c, bool front, int64_t* unit) {
    uint64_t word = cursors[c].load(std::memory_order_relaxed);
    while (true) {
      const uint64_t next = word >> 32, end = word & 0xffffffffu;
      if (next >= end) return false;
      const uint64_t updated = front ? word + (uint64_t{1} << 32) : word - 1;
      if (cursors[c].compare_exchange_weak(word, updated, std::memory_order_relaxed)) {
        *unit = static_cast<int64_t>(front ? next : end - 1);
        return true;
      }
    }
  };
  ParallelFor(shares, 1, [&](int64_t first, int64_t last) {
    int64_t unit;
    for (int64_t c = first; c < last; ++c) {
      while (take(c, true, &unit)) {
        run_rows(units[unit].task, units[unit].row_begin, units[unit].row_end);
      }
    }
    for (int64_t c = 0; c < shares; ++c) {
      while (take(c, false, &unit)) {
        run_rows(units[unit].task, units[unit].row_begin, units[unit].row_end);
      }
    }
  });
}


}  // namespace internal
}  // namespace k3
