// The AVX-512 kernels of kernels/matmul_internal.h. Every function that uses AVX-512 carries a
// target attribute (the rest of the binary stays baseline x86-64); callers check CpuHasAvx512().

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "glog/logging.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/matmul_x86.h"
// GCC 12's AVX-512 headers initialize their "undefined" vectors from themselves (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define K3_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#endif

namespace k3::internal {

#if defined(__x86_64__)
namespace {

// ---- Row kernel -------------------------------------------------------------------------------
//
// Each block of R weight rows is read once from memory, as R sequential streams (one token through
// short rows: R streams of two rows each, see x86::RowsGroup), and dotted with the tokens in
// groups of up to 4 (a second group finds the rows in L1/L2). Partial sums run along the input
// dimension in vectors and are reduced at the end of the row. BF16 rows are loaded 32 inputs at a
// time and widened with one shift (even inputs) and one mask (odd inputs); the activations are
// packed once per call to match, each 32-input block as [16 even][16 odd].

// The walk over spans, token groups and blocks is x86::RowsAnyType's (kernels/matmul_x86.h).

// Keeps a loaded vector in a register: without this the compiler re-reads activations from memory
// for every weight row, and the loads, not the multiplies, become the bottleneck.
K3_AVX512 inline void KeepInRegister(__m512& v) { asm("" : "+v"(v)); }

// Loads the 32-input block at k of T packed activation rows (see PackRowInputs) as its even and
// odd inputs, kept in registers for every row of the block.
template <int T>
K3_AVX512 inline void LoadPackedInputs(const float* const* xp, int64_t k, __m512 (&even)[T],
                                       __m512 (&odd)[T]) {
  for (int t = 0; t < T; ++t) {
    even[t] = _mm512_load_ps(xp[t] + k);
    odd[t] = _mm512_load_ps(xp[t] + k + 16);
    KeepInRegister(even[t]);
    KeepInRegister(odd[t]);
  }
}

// The sums of four vectors, in the four lanes of the result (a, b, c, d).
K3_AVX512 inline __m128 SumsOf4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Halve twice across 128-bit lanes, then once more within each lane twice.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
  // Lane i of v holds four partial sums of (a, b, c, d)[i].
  __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

// Reduces each accumulator and stores (or adds) it to y[t][row + r].
template <int T, int R>
K3_AVX512 inline void StoreSums(const __m512 (&acc)[R][T], float* const* yt, int64_t row,
                                bool accumulate) {
  constexpr int kCount = R * T;
  float sums[kCount + 3];
  int i = 0;
  for (; i + 4 <= kCount; i += 4) {
    _mm_storeu_ps(sums + i, SumsOf4(acc[i / T][i % T], acc[(i + 1) / T][(i + 1) % T],
                                    acc[(i + 2) / T][(i + 2) % T], acc[(i + 3) / T][(i + 3) % T]));
  }
  if constexpr (kCount % 4 != 0) {  // a tail only where the groups of four leave one
    for (; i < kCount; ++i) sums[i] = _mm512_reduce_add_ps(acc[i / T][i % T]);
  }
  x86::StoreRowSums<T, R>(sums, yt, row, accumulate);
}

// xp: T packed activation rows (see PackRowInputs). R streams of P consecutive rows each (see
// kernels/matmul_x86.h).
template <int T, int R, int P>
K3_AVX512 void RowsBlock(const uint16_t* w, int64_t cols, const float* const* xp,
                         float* const* yt, bool accumulate, int64_t row) {
  __m512 acc[R * P][T];
  x86::ZeroAccumulators(acc);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __mmask32 tail = static_cast<__mmask32>((1ull << (cols % 32)) - 1);
  x86::ForEachRowStep<32, R, P>(
      w, cols, row, cols, [&](int p, int64_t k, const auto& streams) K3_AVX512 {
        const __mmask32 mask = k + 32 <= cols ? ~__mmask32{0} : tail;
        __m512 even[T], odd[T];
        LoadPackedInputs(xp, k, even, odd);
        for (int r = 0; r < R; ++r) {
          const __m512i v = _mm512_maskz_loadu_epi16(mask, streams[r] + p * cols + k);
          const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
          const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, high_half));
          for (int t = 0; t < T; ++t) {
            acc[P * r + p][t] = _mm512_fmadd_ps(we, even[t], acc[P * r + p][t]);
            acc[P * r + p][t] = _mm512_fmadd_ps(wo, odd[t], acc[P * r + p][t]);
          }
        }
      });
  StoreSums<T, R * P>(acc, yt, row, accumulate);
}

// xp: T activation rows as given. Streams as for BF16.
template <int T, int R, int P>
K3_AVX512 void RowsBlock(const float* w, int64_t cols, const float* const* xp, float* const* yt,
                         bool accumulate, int64_t row) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols % 16)) - 1);
  __m512 acc[R * P][T];
  x86::ZeroAccumulators(acc);
  x86::ForEachRowStep<16, R, P>(
      w, cols, row, cols, [&](int p, int64_t k, const auto& streams) K3_AVX512 {
        const __mmask16 mask = k + 16 <= cols ? ~__mmask16{0} : tail;
        __m512 xv[T];
        for (int t = 0; t < T; ++t) {
          xv[t] = _mm512_maskz_loadu_ps(mask, xp[t] + k);
          KeepInRegister(xv[t]);
        }
        for (int r = 0; r < R; ++r) {
          const __m512 wv = _mm512_maskz_loadu_ps(mask, streams[r] + p * cols + k);
          for (int t = 0; t < T; ++t) {
            acc[P * r + p][t] = _mm512_fmadd_ps(wv, xv[t], acc[P * r + p][t]);
          }
        }
      });
  StoreSums<T, R * P>(acc, yt, row, accumulate);
}

// x86::ScaledE2m1Bits as the fp32 values (read by vector loads only).
inline const float* ScaledE2m1Tables() {
  return reinterpret_cast<const float*>(x86::ScaledE2m1Bits());
}

// xp: T packed activation rows, as for BF16: a 32-input group's 16 bytes of codes widen to one
// 32-bit lane per byte, whose low nibble is the even input and high nibble the odd one. vpermps
// reads only the low 4 bits of each index, so each half is one lookup in the E2M1 table already
// multiplied by the group's scale (exact: a power of two). One row per stream (see
// x86::RowsGroup).
// REQUIRES: cols % 32 == 0.
template <int T, int R, int P>
K3_AVX512 void RowsBlock(const x86::Mxfp4Rows* w, int64_t cols, const float* const* xp,
                         float* const* yt, bool accumulate, int64_t row) {
  static_assert(P == 1, "MXFP4 rows are read one per stream");
  const float* scaled_tables = ScaledE2m1Tables();
  __m512 acc[R][T];
  x86::ZeroAccumulators(acc);
  x86::ForEachMxfp4Group<R>(
      *w, cols, row, [&](int64_t k, const auto& codes, const auto& scales) K3_AVX512 {
        if (k == 0) {  // the next block's scales, R * cols / 32 bytes
          for (int64_t b = 0; b < R * cols / kMxfp4Group; b += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(scales[0] + R * cols / kMxfp4Group) + b,
                         _MM_HINT_T0);
          }
        }
        __m512 even[T], odd[T];
        LoadPackedInputs(xp, k, even, odd);
        for (int r = 0; r < R; ++r) {
          const __m512i v = _mm512_cvtepu8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes[r] + k / 2)));
          const __m512 scaled = _mm512_load_ps(scaled_tables + 16 * scales[r][k / kMxfp4Group]);
          const __m512 we = _mm512_permutexvar_ps(v, scaled);
          const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), scaled);
          for (int t = 0; t < T; ++t) {
            acc[r][t] = _mm512_fmadd_ps(we, even[t], acc[r][t]);
            acc[r][t] = _mm512_fmadd_ps(wo, odd[t], acc[r][t]);
          }
        }
      });
  StoreSums<T, R>(acc, yt, row, accumulate);
}

// Decodes rows [row, row + rows) of `w` into out[rows][cols] bf16, inputs in their natural order.
// Exact: every MXFP4 value has at most 2 significant bits, so its fp32 bits end in 16 zeros.
K3_AVX512 void DecodeMxfp4Rows(const x86::Mxfp4Rows& w, int64_t cols, int64_t row, int64_t rows,
                               uint16_t* out) {
  const float* scaled_tables = ScaledE2m1Tables();
  // Word j of a group: the high half (word 2i + 1) of lane i of the even inputs for j = 2i, of
  // the odd inputs (words 32 + ...) for j = 2i + 1.
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      1,  33, 3,  35, 5,  37, 7,  39, 9,  41, 11, 43, 13, 45, 15, 47,
      17, 49, 19, 51, 21, 53, 23, 55, 25, 57, 27, 59, 29, 61, 31, 63};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* codes = w.codes + (row + r) * cols / 2;
    const uint8_t* scales = w.scales + (row + r) * cols / kMxfp4Group;
    uint16_t* dst = out + r * cols;
    for (int64_t k = 0; k < cols; k += kMxfp4Group) {
      const __m512i v =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k / 2)));
      const __m512 scaled = _mm512_load_ps(scaled_tables + 16 * scales[k / kMxfp4Group]);
      const __m512 even = _mm512_permutexvar_ps(v, scaled);
      const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), scaled);
      _mm512_storeu_si512(dst + k, _mm512_permutex2var_epi16(_mm512_castps_si512(even), interleave,
                                                             _mm512_castps_si512(odd)));
    }
  }
}

// Packs `tokens` activation rows for the bf16 row kernel: each block of 32 inputs as its 16 even
// then its 16 odd inputs, zero-padded to padded_cols (a multiple of 32).
K3_AVX512 void PackRowInputs(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                             int64_t padded_cols, float* packed) {
  const __m512i even_index = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6,
                                              4, 2, 0);
  const __m512i odd_index = _mm512_add_epi32(even_index, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = x + t * x_stride;
    float* out = packed + t * padded_cols;
    for (int64_t k = 0; k < padded_cols; k += 32) {
      const int64_t left = std::clamp<int64_t>(cols - k, 0, 32);
      const __mmask16 lo = static_cast<__mmask16>((1u << std::min<int64_t>(left, 16)) - 1);
      const __mmask16 hi = static_cast<__mmask16>((1u << std::max<int64_t>(left - 16, 0)) - 1);
      const __m512 a = _mm512_maskz_loadu_ps(lo, src + k);
      const __m512 b = _mm512_maskz_loadu_ps(hi, src + k + 16);
      _mm512_store_ps(out + k, _mm512_permutex2var_ps(a, even_index, b));
      _mm512_store_ps(out + k + 16, _mm512_permutex2var_ps(a, odd_index, b));
    }
  }
}

// This family for x86::RowsAnyType (kernels/matmul_x86.h): 8 weight streams for 1-2 tokens, 4
// for 3-4 tokens (16 accumulators and 8 activation vectors; 5 rows measured no faster); one token
// through short rows: 8 streams of two rows.
struct Avx512 : x86::RowBlockShape<8, 8, 8, 4, 4> {
  template <int T, int R, int P, typename... Args>
  K3_AVX512 static void Block(Args... args) { RowsBlock<T, R, P>(args...); }
};

// Avx512RowKernel().
constexpr RowKernel kAvx512RowKernel{PackRowInputs, PackRowInputs, x86::RowsAnyType<Avx512>};

// ---- Tiled kernel -----------------------------------------------------------------------------
//
// Per thread and block of inputs (kc) and tokens (mc): the activations are packed into 8-token
// tiles [k][8]; then each panel of 48 weight rows is packed (transposed so that one k gives the 48
// rows in three registers) and multiplied with every tile. The packed panel stays in L1 while the
// tiles stream from L2. BF16 panels keep the weights as bf16 pairs, [k / 2][48][2], so packing is
// one 32-bit transpose; the micro-kernel widens them with a shift (even k) and a mask (odd k).

constexpr int kTileTokens = 8;
// Rows of MXFP4 weights decoded at a time for the tiled kernel (a multiple of kTileRows).
constexpr int64_t kMxfp4BlockRows = 8 * kTileRows;
constexpr int64_t kBlockTokens = 256;  // mc: packed activations 256 x 384 fp32 are 384 KiB (L2)
// kc: a packed panel is 48 x 384 bf16 or 48 x 192 fp32, 36 KiB either way (L1 is 48 KiB).
template <typename WT>
constexpr int64_t kBlockInputs = sizeof(WT) == 2 ? 384 : 192;
constexpr int64_t kPanelBytes = 48 * 384 * 2;
static_assert(kTileRows == 48, "the micro-kernel holds 48 rows in three registers");
static_assert(kBlockInputs<uint16_t> % 32 == 0 && kBlockInputs<float> % 16 == 0);
static_assert(kBlockInputs<uint16_t> * kTileRows * 2 <= kPanelBytes &&
              kBlockInputs<float> * kTileRows * 4 <= kPanelBytes);


// Per-thread packing buffers, allocated on first use.
struct TileScratch {
  std::unique_ptr<float, FreeDeleter> weights{
      static_cast<float*>(std::aligned_alloc(64, kPanelBytes))};
  std::unique_ptr<float, FreeDeleter> inputs{static_cast<float*>(std::aligned_alloc(
      64, kBlockTokens * kBlockInputs<uint16_t> * sizeof(float)))};
};

TileScratch& ThreadScratch() {
  thread_local TileScratch scratch;
  return scratch;
}

alignas(64) constexpr char kZeroSegment[64] = {};

// Transposes 16 rows of 16 32-bit units (one 64-byte segment of each row) into 16 vectors of the
// 16 rows, stored at out + j * 48 for unit j. The 128-bit lanes are gathered by loads (cheap)
// rather than lane shuffles (the scarce port), leaving one 4 x 4 transpose inside each lane.
K3_AVX512 inline void TransposeSegments(const char* const segment[16], float* out) {
  for (int b = 0; b < 4; ++b) {
    __m512i z[4];  // lane L of z[a]: units 4b..4b+3 of row 4L + a
    for (int a = 0; a < 4; ++a) {
      auto chunk = [&](int r) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(segment[r] + 16 * b));
      };
      __m512i v = _mm512_castsi128_si512(chunk(a));
      v = _mm512_inserti32x4(v, chunk(4 + a), 1);
      v = _mm512_inserti32x4(v, chunk(8 + a), 2);
      z[a] = _mm512_inserti32x4(v, chunk(12 + a), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    const __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    const __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    float* o = out + 4 * b * kTileRows;
    _mm512_store_si512(o, _mm512_unpacklo_epi64(t0, t2));
    _mm512_store_si512(o + kTileRows, _mm512_unpackhi_epi64(t0, t2));
    _mm512_store_si512(o + 2 * kTileRows, _mm512_unpacklo_epi64(t1, t3));
    _mm512_store_si512(o + 3 * kTileRows, _mm512_unpackhi_epi64(t1, t3));
  }
}

// Packs rows [row, row + rows) x inputs [k0, k0 + kc) as 32-bit units: packed[u * 48 + r] is unit
// u of row r, where a unit is one f32 or a bf16 pair (inputs 2u, 2u + 1). Rows past `rows` and
// inputs past kc, up to a whole 64-byte segment, are zero.
template <typename WT>
K3_AVX512 void PackWeights(const WT* w, int64_t cols, int64_t row, int64_t rows, int64_t k0,
                           int64_t kc, float* packed) {
  constexpr int64_t kSegment = 64 / sizeof(WT);  // inputs per 64-byte segment
  constexpr int64_t kPerUnit = 4 / sizeof(WT);
  for (int64_t g = 0; g < kTileRows / 16; ++g) {
    const char* start[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t r = g * 16 + i;
      start[i] = r < rows ? reinterpret_cast<const char*>(w + (row + r) * cols + k0) : nullptr;
    }
    for (int64_t k = 0; k < kc; k += kSegment) {
      const char* segment[16];
      alignas(64) char tail[16][64];
      const bool whole = k + kSegment <= kc;
      for (int i = 0; i < 16; ++i) {
        if (start[i] == nullptr) {
          segment[i] = kZeroSegment;
        } else if (whole) {
          segment[i] = start[i] + k * sizeof(WT);
        } else {
          const size_t bytes = (kc - k) * sizeof(WT);
          std::memcpy(tail[i], start[i] + k * sizeof(WT), bytes);
          std::memset(tail[i] + bytes, 0, 64 - bytes);
          segment[i] = tail[i];
        }
      }
      TransposeSegments(segment, packed + (k / kPerUnit) * kTileRows + g * 16);
    }
  }
}

// Adds (or stores) the accumulated tile into y: tokens [0, tokens), rows masked by `rows`.
K3_AVX512 inline void StoreTile(const __m512 (&acc)[kTileTokens][3], float* y, int64_t y_stride,
                                int tokens, const __mmask16 rows[3], bool accumulate) {
  for (int t = 0; t < tokens; ++t) {
    float* out = y + t * y_stride;
    for (int j = 0; j < 3; ++j) {
      if (rows[j] == 0) continue;
      __m512 v = acc[t][j];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(rows[j], out + 16 * j));
      _mm512_mask_storeu_ps(out + 16 * j, rows[j], v);
    }
  }
}

// acc[t][j] += w_j * x[t] for the tile's tokens: one input's step of the micro-kernels, x its
// activations (kTileTokens of them), w0..w2 its weights for the panel's three 16-row groups.
K3_AVX512 inline __attribute__((always_inline)) void TileFma(__m512 w0, __m512 w1, __m512 w2,
                                                             const float* x,
                                                             __m512 (&acc)[kTileTokens][3]) {
#pragma GCC unroll 8
  for (int t = 0; t < kTileTokens; ++t) {
    const __m512 b = _mm512_set1_ps(x[t]);
    acc[t][0] = _mm512_fmadd_ps(w0, b, acc[t][0]);
    acc[t][1] = _mm512_fmadd_ps(w1, b, acc[t][1]);
    acc[t][2] = _mm512_fmadd_ps(w2, b, acc[t][2]);
  }
}

// y[t, 0:48] (+)= sum_k W[k, 0:48] * x[k, t] for one packed panel and one packed tile.
// REQUIRES: kc even (both packs are zero-padded to it).
K3_AVX512 void MicroKernel(const uint16_t*, const float* packed_w, const float* packed_x,
                           int64_t kc, float* y, int64_t y_stride, int tokens,
                           const __mmask16 rows[3], bool accumulate) {
  __m512 acc[kTileTokens][3];
  for (int t = 0; t < kTileTokens; ++t) {
    acc[t][0] = acc[t][1] = acc[t][2] = _mm512_setzero_ps();
  }
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t k = 0; k < kc; k += 2) {
    const __m512i* pairs = reinterpret_cast<const __m512i*>(packed_w + (k / 2) * kTileRows);
    const float* xk = packed_x + k * kTileTokens;
    // Even k: the low bf16 of each pair, shifted into place.
    __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(pairs), 16));
    __m512 w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(pairs + 1), 16));
    __m512 w2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(pairs + 2), 16));
    TileFma(w0, w1, w2, xk, acc);
    // Odd k: the high bf16, masked.
    w0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(pairs), high_half));
    w1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(pairs + 1), high_half));
    w2 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_load_si512(pairs + 2), high_half));
    TileFma(w0, w1, w2, xk + kTileTokens, acc);
  }
  StoreTile(acc, y, y_stride, tokens, rows, accumulate);
}

K3_AVX512 void MicroKernel(const float*, const float* packed_w, const float* packed_x, int64_t kc,
                           float* y, int64_t y_stride, int tokens, const __mmask16 rows[3],
                           bool accumulate) {
  __m512 acc[kTileTokens][3];
  for (int t = 0; t < kTileTokens; ++t) {
    acc[t][0] = acc[t][1] = acc[t][2] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float* wk = packed_w + k * kTileRows;
    const __m512 w0 = _mm512_load_ps(wk);
    const __m512 w1 = _mm512_load_ps(wk + 16);
    const __m512 w2 = _mm512_load_ps(wk + 32);
    const float* xk = packed_x + k * kTileTokens;
    TileFma(w0, w1, w2, xk, acc);
  }
  StoreTile(acc, y, y_stride, tokens, rows, accumulate);
}

template <typename WT>
K3_AVX512 void TilesRange(const WT* w, int64_t cols, const float* x, int64_t x_stride,
                          int64_t tokens, float* y, int64_t y_stride, bool accumulate,
                          int64_t row_begin, int64_t row_end) {
  constexpr int64_t kInputs = kBlockInputs<WT>;
  TileScratch& scratch = ThreadScratch();
  float* packed_w = scratch.weights.get();
  float* packed_x = scratch.inputs.get();
  for (int64_t m0 = 0; m0 < tokens; m0 += kBlockTokens) {
    const int64_t mb = std::min(kBlockTokens, tokens - m0);
    const int64_t tiles = (mb + kTileTokens - 1) / kTileTokens;
    for (int64_t k0 = 0; k0 < cols; k0 += kInputs) {
      const int64_t kc = std::min(kInputs, cols - k0);
      const int64_t padded_kc = (kc + 1) / 2 * 2;  // whole bf16 pairs
      x86::PackTileInputs<kTileTokens>(x + m0 * x_stride + k0, x_stride, mb, kc, padded_kc,
                                       packed_x);
      const bool add = accumulate || k0 > 0;
      for (int64_t row = row_begin; row < row_end; row += kTileRows) {
        const int64_t rows = std::min(kTileRows, row_end - row);
        PackWeights(w, cols, row, rows, k0, kc, packed_w);
        __mmask16 masks[3];
        for (int j = 0; j < 3; ++j) {
          const int64_t valid = std::clamp<int64_t>(rows - 16 * j, 0, 16);
          masks[j] = static_cast<__mmask16>((1u << valid) - 1);
        }
        // The weights packed next: the following panel, or the first of the next input block.
        // Their rows are far apart, so no hardware prefetcher fetches them; prefetch them into
        // L2, a share per tile, while the tiles compute.
        const WT* next = nullptr;
        int64_t next_rows = 0, next_bytes = 0;
        if (row + kTileRows < row_end) {
          next = w + (row + kTileRows) * cols + k0;
          next_rows = std::min(kTileRows, row_end - row - kTileRows);
          next_bytes = kc * sizeof(WT);
        } else if (k0 + kc < cols) {
          next = w + row_begin * cols + k0 + kc;
          next_rows = std::min(kTileRows, row_end - row_begin);
          next_bytes = std::min(kInputs, cols - k0 - kc) * sizeof(WT);
        }
        for (int64_t tile = 0; tile < tiles; ++tile) {
          for (int64_t r = tile * next_rows / tiles; r < (tile + 1) * next_rows / tiles; ++r) {
            const char* line = reinterpret_cast<const char*>(next + r * cols);
            for (int64_t b = 0; b < next_bytes; b += 64) _mm_prefetch(line + b, _MM_HINT_T1);
          }
          const int64_t t0 = tile * kTileTokens;
          if (add && tile + 1 < tiles) {
            // The next tile's outputs, read at its end: start fetching them now.
            for (int64_t t = t0 + kTileTokens; t < std::min(mb, t0 + 2 * kTileTokens); ++t) {
              const char* out = reinterpret_cast<const char*>(y + (m0 + t) * y_stride + row);
              for (int64_t b = 0; b < rows * 4; b += 64) _mm_prefetch(out + b, _MM_HINT_T0);
            }
          }
          MicroKernel(w, packed_w, packed_x + t0 * padded_kc, padded_kc,
                      y + (m0 + t0) * y_stride + row, y_stride,
                      static_cast<int>(std::min<int64_t>(kTileTokens, mb - t0)), masks, add);
        }
      }
    }
  }
}

// MXFP4 rows: blocks of rows are decoded once into bf16 (exactly) and multiplied with every token
// by the BF16 kernel, which packs the activations once per block: blocks of several panels keep
// that packing small next to the multiply-adds.
void TilesRange(const x86::Mxfp4Rows* w, int64_t cols, const float* x, int64_t x_stride,
                int64_t tokens, float* y, int64_t y_stride, bool accumulate, int64_t row_begin,
                int64_t row_end) {
  thread_local ThreadBuffer buffer;
  uint16_t* decoded = reinterpret_cast<uint16_t*>(buffer.Get(kMxfp4BlockRows * cols / 2));
  for (int64_t row = row_begin; row < row_end; row += kMxfp4BlockRows) {
    const int64_t rows = std::min(kMxfp4BlockRows, row_end - row);
    DecodeMxfp4Rows(*w, cols, row, rows, decoded);
    TilesRange(static_cast<const uint16_t*>(decoded), cols, x, x_stride, tokens, y + row, y_stride,
               accumulate, 0, rows);
  }
}

}  // namespace

const RowKernel& Avx512RowKernel() { return kAvx512RowKernel; }

void MatMulAvx512Tiles(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t tokens,
                       float* y, int64_t y_stride, bool accumulate) {
  x86::TilesAnyType(w, tokens, kTileRows, [&](auto rows, int64_t begin, int64_t end) {
    TilesRange(rows, w.cols, x, x_stride, tokens, y, y_stride, accumulate, begin, end);
  });
}

#else  // !defined(__x86_64__)

const RowKernel& Avx512RowKernel() {
  LOG(FATAL) << "AVX-512 kernel called on a non-x86 build";
}

void MatMulAvx512Tiles(const WeightMatrix&, const float*, int64_t, int64_t, float*, int64_t,
                       bool) {
  LOG(FATAL) << "AVX-512 kernel called on a non-x86 build";
}

#endif

}  // namespace k3::internal
