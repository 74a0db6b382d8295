// What the AVX2 and AVX-512 kernels (matmul_avx2.cc, matmul_avx512.cc) share: the parts of their
// designs that do not depend on the register file. Each family keeps its own inner kernels (row
// blocks, micro-kernels, packing with intrinsics); this header holds
// - the row kernel's walk: spans of kRowsSpan rows, token groups of up to kMaxGroupTokens inside
//   each span, blocks of rows per group (RowsAnyType, on a family's block kernels), and the
//   dispatch on the weight type that it and the tiled kernels share (VisitWeightRows);
// - the loop inside a BF16 or F32 row block (ForEachRowStep, around a family's step), the
//   software prefetch along weight rows, the MXFP4 rows' pointers and the table of scaled E2M1
//   values both families decode MXFP4 with;
// - the tiled kernel's split of rows across threads (TilesAnyType) and its activation packing
//   (tiles of a family's token count).
//
// x86-64 only (included inside `#if defined(__x86_64__)`). Nothing here carries
// a target attribute: the families' block kernels are called, not inlined, from the walk, once per
// block of rows, and ForEachRowStep is inlined into them with their step, so the arithmetic
// stays in the families' own functions.
//
// Thread-safety: pure functions; ScaledE2m1Bits builds its table once (a function-local static).
#ifndef K3SERVE_KERNELS_MATMUL_X86_H_
#define K3SERVE_KERNELS_MATMUL_X86_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"

namespace k3::internal::x86 {

// ---- Row kernel -------------------------------------------------------------------------------

// Distance, in bytes along each weight row, of the software prefetch.
constexpr int64_t kPrefetchBytes = 1024;

// Prefetches the line kPrefetchBytes ahead of byte `offset` of a row of `row_bytes` in a block of
// R consecutive rows. Past the row's end it continues in the same row of the next block, which
// this thread reads next: the model's rows are often only 1-2 KB long, and without the wrap the
// next block would start with every row's first lines missing. Always inlined: GCC counts a
// function whose only effect is a prefetch as free of side effects and deletes the calls to one
// it did not inline (a build whose inliner gave up on it had no prefetch in any BF16 or F32 row
// block).
template <int R>
inline __attribute__((always_inline)) void PrefetchRowAhead(const void* row, int64_t offset,
                                                            int64_t row_bytes) {
  int64_t ahead = offset + kPrefetchBytes;
  if (ahead >= row_bytes) ahead += (R - 1) * row_bytes;
  _mm_prefetch(static_cast<const char*>(row) + ahead, _MM_HINT_T0);
}

// Tokens dotted with a block of rows at a time (the accumulators a register file holds).
constexpr int kMaxGroupTokens = 4;
// Threads get multiples of kRowsAlign rows (a multiple of every family's rows per block); the
// token groups take turns over spans of kRowsSpan rows, whose weights stay in L2 for the groups
// after the first.
constexpr int64_t kRowsSpan = 32;

// MXFP4 rows (kernels/mxfp4.h): codes [rows, cols / 2] and scales [rows, cols / 32].
struct Mxfp4Rows {
  const uint8_t* codes;
  const uint8_t* scales;
};

// E8M0 byte s -> the fp32 bits of the 16 E2M1 values times 2^(s - 127) (exact: powers of two), 64
// bytes (aligned) per scale, so that a group's lookup table is one aligned load instead of a
// broadcast and a multiply. A checkpoint's scales span a few dozen values, so the lines in use
// stay in L1. Built on first use (matmul_x86.cc: out of line, so that the kernels that look it up
// do not each carry the build).
const uint32_t* ScaledE2m1Bits();

// Sets a block's accumulators (V: a family's vector type) to zero.
template <typename V, int N, int T>
inline __attribute__((always_inline)) void ZeroAccumulators(V (&acc)[N][T]) {
  for (int r = 0; r < N; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = V{};
  }
}

// Stores (or, when `accumulate`, adds) a block's reduced sums, sums[r * T + t], to yt[t][row + r].
template <int T, int R>
inline __attribute__((always_inline)) void StoreRowSums(const float* sums, float* const* yt,
                                                        int64_t row, bool accumulate) {
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float& out = yt[t][row + r];
      out = accumulate ? out + sums[r * T + t] : sums[r * T + t];
    }
  }
}

// The starts of R streams of P consecutive rows each, from `row` (stream r: rows row + P r ..
// row + P r + P - 1 of a matrix of `cols` inputs; see RowsGroup below).
template <int R, int P, typename WT>
inline __attribute__((always_inline)) void RowStreamStarts(const WT* w, int64_t cols, int64_t row,
                                                           const WT* (&streams)[R]) {
  for (int r = 0; r < R; ++r) streams[r] = w + (row + P * r) * cols;
}

// The loop of a BF16 or F32 row block, written once for both families: R streams of P
// consecutive rows from `row` (see RowStreamStarts); for each of the P rows of the streams and
// each step of kStep inputs k < end, prefetches every stream's line ahead (once per 64 bytes) and
// calls step(p, k, streams), which reads the step's weights of stream r at
// streams[r] + p * cols + k. `step` holds the family's loads and FMAs: a lambda that carries the
// family's target attribute, inlined here, so the loop compiles as the family's own code.
template <int kStep, int R, int P, typename WT, typename Step>
inline __attribute__((always_inline)) void ForEachRowStep(const WT* w, int64_t cols, int64_t row,
                                                          int64_t end, Step&& step) {
  constexpr int64_t kBytes = sizeof(WT);
  const WT* streams[R];
  RowStreamStarts<R, P>(w, cols, row, streams);
  for (int p = 0; p < P; ++p) {
    for (int64_t k = 0; k < end; k += kStep) {
      if (kStep * kBytes >= 64 || k * kBytes % 64 == 0) {
        for (int r = 0; r < R; ++r) {
          PrefetchRowAhead<R>(streams[r], kBytes * (p * cols + k), kBytes * P * cols);
        }
      }
      step(p, k, streams);
    }
  }
}

// The loop of an MXFP4 row block, written once for both families: R streams of one row each,
// rows [row, row + R); for each group of kMxfp4Group inputs k < cols, prefetches every stream's
// codes ahead (once per 64-byte line: every 4 groups) and calls step(k, codes, scales), which
// reads stream r's group at codes[r] + k / 2 with the scale byte scales[r][k / kMxfp4Group]. As
// for ForEachRowStep, `step` carries the family's target attribute.
template <int R, typename Step>
inline __attribute__((always_inline)) void ForEachMxfp4Group(const Mxfp4Rows& w, int64_t cols,
                                                             int64_t row, Step&& step) {
  const uint8_t* codes[R];
  const uint8_t* scales[R];
  for (int r = 0; r < R; ++r) {
    codes[r] = w.codes + (row + r) * cols / 2;
    scales[r] = w.scales + (row + r) * cols / kMxfp4Group;
  }
  for (int64_t k = 0; k < cols; k += kMxfp4Group) {
    if (k % 128 == 0) {
      for (int r = 0; r < R; ++r) PrefetchRowAhead<R>(codes[r], k / 2, cols / 2);
    }
    step(k, codes, scales);
  }
}

// Bytes of one weight row.
inline int64_t RowBytes(const uint16_t*, int64_t cols) { return 2 * cols; }
inline int64_t RowBytes(const float*, int64_t cols) { return 4 * cols; }

// For one token, BF16 and F32 rows of kShortRowBytes or less are read two at a time by each
// stream, as one run of twice the length: a 1 KiB row is only 16 lines and ends before the
// prefetchers get going (AVX-512, one thread on scattered 0.5-8 MB matrices: 26-31 GB/s one row
// at a time, 31-34 two at a time). Not MXFP4, whose product is bound by instructions, not by the
// run length, and which measured slower with twice the accumulators. More tokens would need more
// accumulators than there are registers.
constexpr int64_t kShortRowBytes = 1024;

// The row kernel's walk is written once for a family given as a type `Family`: a RowBlockShape
// with the family's block kernels,
//   template <int T, int R, int P>
//   static void Block(const WT* w, int64_t cols, const float* const* xp, float* const* yt,
//                     bool accumulate, int64_t row);
// for WT uint16_t (BF16), float and Mxfp4Rows (P == 1): rows [row, row + R P) for T tokens as R
// streams of P consecutive rows each (stream r reads rows row + P r .. row + P r + P - 1 one
// after the other).

// A family's block sizes: kRows rows per block for groups of 1, 2, 3 and 4 tokens; for one token
// through short rows, blocks of kShortStreams streams of two rows each.
template <int kShortStreams, int... kRows>
struct RowBlockShape {
  static_assert(sizeof...(kRows) == kMaxGroupTokens);
  static constexpr int kRowsPerBlock[kMaxGroupTokens + 1] = {0, kRows...};
  static constexpr int kShortRowStreams = kShortStreams;
};

// Rows [row_begin, row_end) for one group of T tokens.
template <typename Family, typename WT, int T>
void RowsGroup(const WT* w, int64_t cols, const float* const* xp, float* const* yt,
               bool accumulate, int64_t row_begin, int64_t row_end) {
  constexpr int R = Family::kRowsPerBlock[T];
  int64_t row = row_begin;
  if constexpr (T == 1 && !std::is_same_v<WT, Mxfp4Rows>) {
    constexpr int S = Family::kShortRowStreams;
    if (RowBytes(w, cols) <= kShortRowBytes) {
      for (; row + 2 * S <= row_end; row += 2 * S) {
        Family::template Block<T, S, 2>(w, cols, xp, yt, accumulate, row);
      }
    }
  }
  for (; row + R <= row_end; row += R) {
    Family::template Block<T, R, 1>(w, cols, xp, yt, accumulate, row);
  }
  for (; row < row_end; ++row) Family::template Block<T, 1, 1>(w, cols, xp, yt, accumulate, row);
}

// Rows [row_begin, row_end) for all tokens: spans of rows outside, token groups inside, so that
// every group after the first finds the span's weights in cache. Even groups: 8 tokens as 4 + 4,
// 7 as 4 + 3, 6 as 3 + 3, 5 as 3 + 2.
template <typename Family, typename WT>
void RowsRange(const WT* w, int64_t cols, const float* const* xp, float* const* yt,
               int64_t tokens, bool accumulate, int64_t row_begin, int64_t row_end) {
  static_assert(kRowsAlign % Family::kRowsPerBlock[1] == 0);
  const int64_t groups = (tokens + kMaxGroupTokens - 1) / kMaxGroupTokens;
  for (int64_t row = row_begin; row < row_end; row += kRowsSpan) {
    const int64_t end = std::min(row_end, row + kRowsSpan);
    int64_t t0 = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t t1 = tokens * (g + 1) / groups;
      const float* const* x = xp + t0;
      float* const* y = yt + t0;
      switch (t1 - t0) {
        case 1: RowsGroup<Family, WT, 1>(w, cols, x, y, accumulate, row, end); break;
        case 2: RowsGroup<Family, WT, 2>(w, cols, x, y, accumulate, row, end); break;
        case 3: RowsGroup<Family, WT, 3>(w, cols, x, y, accumulate, row, end); break;
        default: RowsGroup<Family, WT, 4>(w, cols, x, y, accumulate, row, end); break;
      }
      t0 = t1;
    }
  }
}

// Calls f(rows) with the weights of `w` as rows of its type, the pointer both families' kernels
// take: const uint16_t* (BF16), const Mxfp4Rows* (MXFP4; valid during the call) or const float*
// (F32). The row kernel's walk and both tiled kernels dispatch on the weight type through this.
template <typename F>
void VisitWeightRows(const WeightMatrix& w, F&& f) {
  if (w.type == WeightType::kBf16) {
    f(static_cast<const uint16_t*>(w.data));
  } else if (w.type == WeightType::kMxfp4) {
    const Mxfp4Rows rows{static_cast<const uint8_t*>(w.data), w.scales};
    f(&rows);
  } else {
    f(static_cast<const float*>(w.data));
  }
}

// RowKernel::rows of a family.
template <typename Family>
void RowsAnyType(const WeightMatrix& w, const float* const* xp, float* const* yt, int64_t tokens,
                 bool accumulate, int64_t row_begin, int64_t row_end) {
  VisitWeightRows(w, [&](auto rows) {
    RowsRange<Family>(rows, w.cols, xp, yt, tokens, accumulate, row_begin, row_end);
  });
}

// ---- Tiled kernel -----------------------------------------------------------------------------

// MatMul*Tiles of a family: the rows of `w` split across the kernel pool in multiples of `align`
// (ParallelForRows), and each range given to range(rows, begin, end), `rows` as VisitWeightRows
// gives them.
template <typename Range>
void TilesAnyType(const WeightMatrix& w, int64_t tokens, int64_t align, const Range& range) {
  ParallelForRows(w, tokens, align, [&](int64_t begin, int64_t end) {
    VisitWeightRows(w, [&](auto rows) { range(rows, begin, end); });
  });
}

// Packs tiles of kTileTokens tokens for a micro-kernel that broadcasts one activation at a time:
// packed[(tile * padded_kc + k) * kTileTokens + t] = x[(tile * kTileTokens + t) * x_stride + k]
// for k < kc, zero for tokens past `tokens` and for k in [kc, padded_kc).
template <int kTileTokens>
void PackTileInputs(const float* x, int64_t x_stride, int64_t tokens, int64_t kc,
                    int64_t padded_kc, float* packed) {
  for (int64_t tile = 0; tile * kTileTokens < tokens; ++tile) {
    float* out = packed + tile * padded_kc * kTileTokens;
    for (int t = 0; t < kTileTokens; ++t) {
      const int64_t token = tile * kTileTokens + t;
      const int64_t valid = token < tokens ? kc : 0;
      const float* src = x + token * x_stride;
      for (int64_t k = 0; k < valid; ++k) out[k * kTileTokens + t] = src[k];
      for (int64_t k = valid; k < padded_kc; ++k) out[k * kTileTokens + t] = 0.0f;
    }
  }
}

}  // namespace k3::internal::x86

#endif  // K3SERVE_KERNELS_MATMUL_X86_H_
