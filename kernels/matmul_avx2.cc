// The AVX2 kernels of kernels/matmul_internal.h (AVX2 + FMA: 16 ymm registers of 8 floats). Every
// function that uses them carries a target attribute (the rest of the binary stays baseline
// x86-64); callers check CpuSupports(KernelIsa::kAvx2).
//
// The designs are those of the AVX-512 kernels (matmul_avx512.cc), sized for half the registers:
// - rows: a block of R weight rows streamed once and dotted with up to 4 tokens, R * T <= 8
//   accumulators; activations packed as there (32-input blocks as [16 even][16 odd]), so a 16-input
//   half of a block is one ymm of bf16 pairs widened by a shift (even) and a mask (odd).
// - MXFP4 rows: vpshufb looks 32 codes at a time up in 16-entry tables of the bytes of each scaled
//   value's bf16 (exact), which then widen as BF16 rows do; the activations come in an order of
//   their own (PackMxfp4Inputs) so that no step moves data across 128-bit lanes.
// - tiles: panels of 16 rows x 256 inputs packed as 32-bit units (a bf16 pair, an f32, or one
//   MXFP4 code byte decoded to a bf16 pair, exactly), multiplied with 6-token tiles of packed
//   activations by a 16 x 6 outer-product micro-kernel (12 accumulators, 2 weight registers).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "glog/logging.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/matmul_x86.h"
#define K3_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace k3::internal {

#if defined(__x86_64__)
namespace {

// ---- Row kernel -------------------------------------------------------------------------------

// The sums of four vectors in the four lanes of the result.
K3_AVX2 inline __m128 SumsOf4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Reduces each accumulator and stores (or adds) it to y[t][row + r].
template <int T, int R>
K3_AVX2 inline void StoreSums(const __m256 (&acc)[R][T], float* const* yt, int64_t row,
                              bool accumulate) {
  constexpr int kCount = R * T;
  constexpr int kPadded = (kCount + 3) / 4 * 4;
  __m256 flat[kPadded];
  for (int i = 0; i < kPadded; ++i) flat[i] = i < kCount ? acc[i / T][i % T] : _mm256_setzero_ps();
  float sums[kPadded];
  for (int i = 0; i < kPadded; i += 4) {
    _mm_storeu_ps(sums + i, SumsOf4(flat[i], flat[i + 1], flat[i + 2], flat[i + 3]));
  }
  x86::StoreRowSums<T, R>(sums, yt, row, accumulate);
}

// One 32-input step of R BF16 rows into accumulators acc[P r + p]: w[r] points at the step's 32
// weights of row P r + p.
template <int T, int R, int P>
K3_AVX2 inline void Bf16Step(const uint16_t* const (&w)[R], const float* const* xp, int64_t k,
                             int p, __m256 (&acc)[R * P][T]) {
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int h = 0; h < 2; ++h) {
    __m256 even[T], odd[T];
    for (int t = 0; t < T; ++t) {
      even[t] = _mm256_load_ps(xp[t] + k + 8 * h);
      odd[t] = _mm256_load_ps(xp[t] + k + 16 + 8 * h);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 16 * h));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
      for (int t = 0; t < T; ++t) {
        acc[P * r + p][t] = _mm256_fmadd_ps(we, even[t], acc[P * r + p][t]);
        acc[P * r + p][t] = _mm256_fmadd_ps(wo, odd[t], acc[P * r + p][t]);
      }
    }
  }
}

// xp: T packed activation rows (zero past cols, up to a multiple of 32). R streams of P
// consecutive rows each (see kernels/matmul_x86.h).
template <int T, int R, int P>
K3_AVX2 void RowsBlock(const uint16_t* w, int64_t cols, const float* const* xp, float* const* yt,
                       bool accumulate, int64_t row) {
  __m256 acc[R * P][T];
  x86::ZeroAccumulators(acc);
  const int64_t whole = cols / 32 * 32;
  x86::ForEachRowStep<32, R, P>(w, cols, row, whole,
                                [&](int p, int64_t k, const auto& streams) K3_AVX2 {
                                  const uint16_t* at[R];
                                  for (int r = 0; r < R; ++r) at[r] = streams[r] + p * cols + k;
                                  Bf16Step<T, R, P>(at, xp, k, p, acc);
                                });
  if (whole < cols) {  // the last partial step of each row from zero-padded copies
    for (int p = 0; p < P; ++p) {
      alignas(32) uint16_t tail[R][32] = {};
      const uint16_t* at[R];
      for (int r = 0; r < R; ++r) {
        std::memcpy(tail[r], w + (row + P * r + p) * cols + whole, 2 * (cols - whole));
        at[r] = tail[r];
      }
      Bf16Step<T, R, P>(at, xp, whole, p, acc);
    }
  }
  StoreSums<T, R * P>(acc, yt, row, accumulate);
}

// xp: T activation rows as given. Streams as for BF16.
template <int T, int R, int P>
K3_AVX2 void RowsBlock(const float* w, int64_t cols, const float* const* xp, float* const* yt,
                       bool accumulate, int64_t row) {
  __m256 acc[R * P][T];
  x86::ZeroAccumulators(acc);
  x86::ForEachRowStep<8, R, P>(
      w, cols, row, cols, [&](int p, int64_t k, const auto& streams) K3_AVX2 {
        const int64_t left = std::min<int64_t>(8, cols - k);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 xv[T];
        for (int t = 0; t < T; ++t) xv[t] = _mm256_maskload_ps(xp[t] + k, mask);
        for (int r = 0; r < R; ++r) {
          const __m256 wv = _mm256_maskload_ps(streams[r] + p * cols + k, mask);
          for (int t = 0; t < T; ++t) {
            acc[P * r + p][t] = _mm256_fmadd_ps(wv, xv[t], acc[P * r + p][t]);
          }
        }
      });
  StoreSums<T, R * P>(acc, yt, row, accumulate);
}

// E8M0 byte s -> 32 bytes: [0, 16) the low and [16, 32) the high bytes of the bf16 of E2M1 value
// c times 2^(s - 127) (exact: see Mxfp4Units below). 8 KiB; the scales in use stay in L1.
const uint8_t* Bf16ByteTables() {
  static const uint8_t* tables = [] {
    alignas(32) static uint8_t bytes[256 * 32];
    const uint32_t* scaled = x86::ScaledE2m1Bits();
    for (int i = 0; i < 256 * 16; ++i) {
      bytes[i / 16 * 32 + i % 16] = static_cast<uint8_t>(scaled[i] >> 16);
      bytes[i / 16 * 32 + 16 + i % 16] = static_cast<uint8_t>(scaled[i] >> 24);
    }
    return bytes;
  }();
  return tables;
}

// Per group and row: vpsrlvd and a mask make one vector of the group's 32 codes, one per byte
// (lane 0 the low nibbles of its 16 bytes, inputs 0, 2, ..., 30; lane 1 the high ones, inputs 1,
// 3, ..., 31); two vpshufb look them up in the scale's tables of bf16 low and high bytes; two
// unpacks make bf16 words (lane 0: inputs 0, 2, ..., 14, then 16, ..., 30; lane 1 the odd ones);
// a shift (words 0, 2, ...) and a mask (words 1, 3, ...) widen those to fp32 as for BF16 rows.
// That leaves each fp32 vector holding inputs 4d + j of one 16-input half (d = 0..3, j = 0..3 by
// vector and lane), the order PackMxfp4Inputs gives the activations. Every step but the FMAs runs
// on the vector shuffle and shift units, so the fewer the better: this is 7 per group where
// vpermps on 8 weights at a time took 12.
constexpr int kMxfp4Order[32] = {0,  4,  8,  12, 1,  5,  9,  13, 2,  6,  10, 14, 3,  7,  11, 15,
                                 16, 20, 24, 28, 17, 21, 25, 29, 18, 22, 26, 30, 19, 23, 27, 31};

// RowKernel::pack_mxfp4_inputs: packed[k + i] = x[k + kMxfp4Order[i]] for each 32-input block.
void PackMxfp4Inputs(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                     int64_t padded_cols, float* packed) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = x + t * x_stride;
    float* out = packed + t * padded_cols;
    for (int64_t k = 0; k < padded_cols; k += 32) {
      for (int i = 0; i < 32; ++i) {
        const int64_t c = k + kMxfp4Order[i];
        out[k + i] = c < cols ? src[c] : 0.0f;
      }
    }
  }
}

// xp: T activation rows packed by PackMxfp4Inputs; a group's code byte i holds inputs 2i (low
// nibble) and 2i + 1 (high). REQUIRES: cols % 32 == 0.
template <int T, int R, int P>
K3_AVX2 void RowsBlock(const x86::Mxfp4Rows* w, int64_t cols, const float* const* xp,
                       float* const* yt, bool accumulate, int64_t row) {
  static_assert(P == 1, "MXFP4 rows are read one per stream");
  const uint8_t* tables = Bf16ByteTables();
  const __m256i nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  const __m256i low_nibble = _mm256_set1_epi8(0x0f);
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256 acc[R][T];
  x86::ZeroAccumulators(acc);
  const auto step = [&](int64_t k, const auto& codes, const auto& scales) K3_AVX2 {
    for (int r = 0; r < R; ++r) {
      const uint8_t* table = tables + 32 * scales[r][k / kMxfp4Group];
      const __m256i low_bytes =
          _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table)));
      const __m256i high_bytes =
          _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table + 16)));
      const __m256i bytes = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes[r] + k / 2)));
      const __m256i group = _mm256_and_si256(_mm256_srlv_epi32(bytes, nibble_shift), low_nibble);
      const __m256i low = _mm256_shuffle_epi8(low_bytes, group);
      const __m256i high = _mm256_shuffle_epi8(high_bytes, group);
      const __m256i words[2] = {_mm256_unpacklo_epi8(low, high), _mm256_unpackhi_epi8(low, high)};
      for (int h = 0; h < 2; ++h) {
        const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(words[h], 16));
        const __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(words[h], high_half));
        for (int t = 0; t < T; ++t) {
          acc[r][t] = _mm256_fmadd_ps(w0, _mm256_load_ps(xp[t] + k + 16 * h), acc[r][t]);
          acc[r][t] = _mm256_fmadd_ps(w1, _mm256_load_ps(xp[t] + k + 16 * h + 8), acc[r][t]);
        }
      }
    }
  };
  x86::ForEachMxfp4Group<R>(*w, cols, row, step);
  StoreSums<T, R>(acc, yt, row, accumulate);
}

// RowKernel::pack_inputs: per 8 inputs, one shuffle takes the even (odd) ones of two vectors in
// 128-bit-lane order and one 64-bit permute puts them in order.
K3_AVX2 void PackRowInputs(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                           int64_t padded_cols, float* packed) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = x + t * x_stride;
    float* out = packed + t * padded_cols;
    for (int64_t k = 0; k < padded_cols; k += 32) {
      alignas(32) float block[32] = {};
      const float* in = src + k;
      if (k + 32 > cols) {
        std::memcpy(block, src + k, 4 * std::max<int64_t>(0, cols - k));
        in = block;
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 a = _mm256_loadu_ps(in + 16 * h), b = _mm256_loadu_ps(in + 16 * h + 8);
        const __m256d even = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
        const __m256d odd = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd));
        _mm256_store_ps(out + k + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(even, 0xd8)));
        _mm256_store_ps(out + k + 16 + 8 * h, _mm256_castpd_ps(_mm256_permute4x64_pd(odd, 0xd8)));
      }
    }
  }
}

// This family for x86::RowsAnyType (kernels/matmul_x86.h): R * T <= 8 accumulators, leaving
// registers for the activations and the widened weights; one token through short rows: 4 streams
// of two rows.
struct Avx2 : x86::RowBlockShape<4, 8, 4, 2, 2> {
  template <int T, int R, int P, typename... Args>
  K3_AVX2 static void Block(Args... args) { RowsBlock<T, R, P>(args...); }
};

// Avx2RowKernel().
constexpr RowKernel kAvx2RowKernel{PackRowInputs, PackMxfp4Inputs, x86::RowsAnyType<Avx2>};

// ---- Tiled kernel -----------------------------------------------------------------------------

constexpr int kPanelRows = 16;
constexpr int kTileTokens = 6;
constexpr int64_t kBlockUnits = 128;  // kc in 32-bit units: 256 bf16 inputs, 128 f32; 8 KiB panel
constexpr int64_t kBlockTokens = 43 * kTileTokens;  // 258: a 256-token prefill in one block

// Unit u (inputs 2u, 2u + 1 for bf16 and MXFP4; input u for f32) of row r, as 32 bits; REQUIRES
// u within the row (BF16: an odd last input gives a zero high half).
struct Bf16Units {
  const uint16_t* w;
  int64_t cols;
  static constexpr int kInputsPerUnit = 2;
  uint32_t operator()(int64_t r, int64_t u) const {
    const uint16_t* p = w + r * cols + 2 * u;
    return p[0] | (2 * u + 1 < cols ? uint32_t{p[1]} << 16 : 0);
  }
};
struct F32Units {
  const float* w;
  int64_t cols;
  static constexpr int kInputsPerUnit = 1;
  uint32_t operator()(int64_t r, int64_t u) const {
    uint32_t bits;
    std::memcpy(&bits, w + r * cols + u, 4);
    return bits;
  }
};
// One code byte as the bf16 pair of its two values times the group's scale (exact: at most 2
// significant bits, so the fp32 value's low 16 bits are zero).
struct Mxfp4Units {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t cols;
  const uint32_t* scaled;  // [256][16] fp32 bits of E2M1 value c times scale s
  static constexpr int kInputsPerUnit = 2;
  uint32_t operator()(int64_t r, int64_t u) const {
    const uint8_t byte = codes[r * cols / 2 + u];
    const uint32_t* table = scaled + 16 * scales[(r * cols + 2 * u) / kMxfp4Group];
    return (table[byte & 0xf] >> 16) | (table[byte >> 4] & 0xffff0000u);
  }
};

// The units of x86::VisitWeightRows's rows.
Bf16Units UnitsOf(const uint16_t* w, int64_t cols) { return {w, cols}; }
F32Units UnitsOf(const float* w, int64_t cols) { return {w, cols}; }
Mxfp4Units UnitsOf(const x86::Mxfp4Rows* w, int64_t cols) {
  return {w->codes, w->scales, cols, x86::ScaledE2m1Bits()};
}

// packed[u * 16 + r] = unit u0 + u of row row + r; zero for rows past `rows` and units past
// `units` up to padded_units.
template <typename Units>
void PackPanel(const Units& w, int64_t row, int64_t rows, int64_t u0, int64_t units,
               int64_t padded_units, uint32_t* packed) {
  for (int64_t r = 0; r < kPanelRows; ++r) {
    for (int64_t u = 0; u < padded_units; ++u) {
      packed[u * kPanelRows + r] = r < rows && u < units ? w(row + r, u0 + u) : 0;
    }
  }
}

// Adds (or stores) a tile: tokens [0, tokens), rows [0, rows).
K3_AVX2 inline void StoreTile(const __m256 (&acc)[kTileTokens][2], float* y, int64_t y_stride,
                              int tokens, int rows, bool accumulate) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), lane);
  const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows - 8), lane);
  for (int t = 0; t < tokens; ++t) {
    float* out = y + t * y_stride;
    __m256 v0 = acc[t][0], v1 = acc[t][1];
    if (accumulate) {
      v0 = _mm256_add_ps(v0, _mm256_maskload_ps(out, mask0));
      v1 = _mm256_add_ps(v1, _mm256_maskload_ps(out + 8, mask1));
    }
    _mm256_maskstore_ps(out, mask0, v0);
    _mm256_maskstore_ps(out + 8, mask1, v1);
  }
}

// y[t, 0:16] (+)= sum over the panel. Bf16 pairs: even inputs by a shift, odd ones by a mask;
// packed_x holds 2 * units inputs per token.
K3_AVX2 void MicroKernelPairs(const uint32_t* packed_w, const float* packed_x, int64_t units,
                              float* y, int64_t y_stride, int tokens, int rows, bool accumulate) {
  __m256 acc[kTileTokens][2];
  for (int t = 0; t < kTileTokens; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t u = 0; u < units; ++u) {
    const __m256i a0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(packed_w + u * 16));
    const __m256i a1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(packed_w + u * 16 + 8));
    const float* xk = packed_x + 2 * u * kTileTokens;
    __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(a0, 16));
    __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(a1, 16));
#pragma GCC unroll 6
    for (int t = 0; t < kTileTokens; ++t) {
      const __m256 b = _mm256_broadcast_ss(xk + t);
      acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
    }
    w0 = _mm256_castsi256_ps(_mm256_and_si256(a0, high_half));
    w1 = _mm256_castsi256_ps(_mm256_and_si256(a1, high_half));
#pragma GCC unroll 6
    for (int t = 0; t < kTileTokens; ++t) {
      const __m256 b = _mm256_broadcast_ss(xk + kTileTokens + t);
      acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
    }
  }
  StoreTile(acc, y, y_stride, tokens, rows, accumulate);
}

K3_AVX2 void MicroKernelF32(const uint32_t* packed_w, const float* packed_x, int64_t units,
                            float* y, int64_t y_stride, int tokens, int rows, bool accumulate) {
  __m256 acc[kTileTokens][2];
  for (int t = 0; t < kTileTokens; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const float* wf = reinterpret_cast<const float*>(packed_w);
  for (int64_t u = 0; u < units; ++u) {
    const __m256 w0 = _mm256_load_ps(wf + u * 16);
    const __m256 w1 = _mm256_load_ps(wf + u * 16 + 8);
    const float* xk = packed_x + u * kTileTokens;
#pragma GCC unroll 6
    for (int t = 0; t < kTileTokens; ++t) {
      const __m256 b = _mm256_broadcast_ss(xk + t);
      acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
    }
  }
  StoreTile(acc, y, y_stride, tokens, rows, accumulate);
}

// Rows [row_begin, row_end) of y for every token.
template <typename Units>
K3_AVX2 void TilesRange(const Units& w, int64_t cols, const float* x, int64_t x_stride,
                        int64_t tokens, float* y, int64_t y_stride, bool accumulate,
                        int64_t row_begin, int64_t row_end) {
  constexpr int64_t kPer = Units::kInputsPerUnit;
  thread_local ThreadBuffer panel_buffer, input_buffer;
  uint32_t* panel = reinterpret_cast<uint32_t*>(panel_buffer.Get(kBlockUnits * kPanelRows));
  float* packed_x = input_buffer.Get(kBlockTokens * kBlockUnits * kPer);
  const int64_t units_total = (cols + kPer - 1) / kPer;
  for (int64_t m0 = 0; m0 < tokens; m0 += kBlockTokens) {
    const int64_t mb = std::min(kBlockTokens, tokens - m0);
    const int64_t tiles = (mb + kTileTokens - 1) / kTileTokens;
    for (int64_t u0 = 0; u0 < units_total; u0 += kBlockUnits) {
      const int64_t units = std::min(kBlockUnits, units_total - u0);
      const int64_t kc = std::min(units * kPer, cols - u0 * kPer);
      x86::PackTileInputs<kTileTokens>(x + m0 * x_stride + u0 * kPer, x_stride, mb, kc,
                                       units * kPer, packed_x);
      const bool add = accumulate || u0 > 0;
      for (int64_t row = row_begin; row < row_end; row += kPanelRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, row_end - row));
        PackPanel(w, row, rows, u0, units, units, panel);
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t t0 = tile * kTileTokens;
          const int n = static_cast<int>(std::min<int64_t>(kTileTokens, mb - t0));
          float* out = y + (m0 + t0) * y_stride + row;
          const float* xt = packed_x + t0 * units * kPer;
          if constexpr (kPer == 2) {
            MicroKernelPairs(panel, xt, units, out, y_stride, n, rows, add);
          } else {
            MicroKernelF32(panel, xt, units, out, y_stride, n, rows, add);
          }
        }
      }
    }
  }
}

}  // namespace

const RowKernel& Avx2RowKernel() { return kAvx2RowKernel; }

void MatMulAvx2Tiles(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                     float* y, int64_t y_stride, bool accumulate) {
  x86::TilesAnyType(w, tokens, kPanelRows, [&](auto rows, int64_t begin, int64_t end) {
    TilesRange(UnitsOf(rows, w.cols), w.cols, x, x_stride, tokens, y, y_stride, accumulate, begin,
               end);
  });
}

#else  // !defined(__x86_64__)

const RowKernel& Avx2RowKernel() { LOG(FATAL) << "AVX2 kernel called on a non-x86 build"; }

void MatMulAvx2Tiles(const WeightMatrix&, const float*, int64_t, int64_t, float*, int64_t, bool) {
  LOG(FATAL) << "AVX2 kernel called on a non-x86 build";
}

#endif

}  // namespace k3::internal
