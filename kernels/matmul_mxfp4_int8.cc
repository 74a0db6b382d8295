// MXFP4 rows with 8-bit activations (Mxfp4Activations::kInt8, kernels/matmul.h), for AVX2 + FMA;
// the AVX-512 family uses the same kernel (it has every instruction this one needs).
//
// Why: with fp32 activations the AVX2 MXFP4 row kernel is bound by instructions, not memory (each
// 32-input group costs 10 shuffles, shifts and masks to widen its codes to fp32 besides 4 FMAs
// per token; on a Zen 3 core that is 5-7 GB/s of weights, against 15-30 GB/s the core can read).
// With 8-bit activations a group's codes are looked up once (vpshufb) as small integers and
// multiplied with the activations by vpmaddubsw/vpmaddwd: about 7 vector instructions per group
// and token instead of 14.
//
// Arithmetic (exact apart from the activations' rounding):
// - Activations: each group g of 32 inputs of a token is q_i = round(x_i * 127 / a_g) with
//   a_g = max |x_i| over the group (q_i in [-127, 127], error at most a_g / 254 per input), and the
//   group's step s_g = a_g / 127.
// - Weights: E2M1 code c as u_c = 2 v_c + 12 (v_c its value; u_c an integer in [0, 24], so
//   vpmaddubsw, whose first operand is unsigned, can take it): one vpshufb on the codes.
// - Group sum: sum_i u_i q_i - 12 sum_i q_i = 2 sum_i v_i q_i, in int32 (|sum| <= 32 * 24 * 127,
//   exact, and below 2^24, so its conversion to fp32 is exact too); the pairs vpmaddubsw adds
//   reach at most 2 * 24 * 127 + 2 * 24 * 127, far from int16 saturation.
// - y += (2^(scale - 127) * s_g / 2) * group sum, in fp32 (one rounding for the product, one for
//   the accumulation), group after group in a fixed order: each (row, token) sum is the same
//   whatever the number of tokens in the call, the row block or the thread that runs it.
//
// Two groups are handled per step (one 32-byte load of codes); a row of an odd number of groups
// ends with a half step whose second group has zero codes and zero activations.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "glog/logging.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/matmul_x86.h"
#define K3_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace k3::internal {

namespace {

// One step's activations of a token: two groups of 32 inputs (g = 2p, 2p + 1), 128 bytes.
struct alignas(64) Int8Pair {
  int8_t even[32];    // [group 2p's inputs 0, 2, .., 30 | group 2p + 1's]
  int8_t odd[32];     // the same for inputs 1, 3, .., 31
  int32_t corr[8];    // 12 sum_i q_i of group 2p in lane 0, of 2p + 1 in lane 4, zero elsewhere
  float step[8];      // s_g / 2 of group 2p in lanes 0-3, of 2p + 1 in lanes 4-7
};
static_assert(sizeof(Int8Pair) == 128);

// Quantizes one group of 32 inputs into half (0 or 1) of a pair. A non-finite input makes the
// group's step NaN, so that every output it reaches is NaN, as in fp32.
void QuantizeGroup(const float* x, int half, Int8Pair* pair) {
  double amax = 0;
  bool finite = true;
  for (int i = 0; i < 32; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::abs(static_cast<double>(x[i])));
  }
  int32_t sum = 0;
  const double inv = amax > 0 && finite ? 127.0 / amax : 0.0;
  for (int i = 0; i < 32; ++i) {
    const int q = finite ? static_cast<int>(std::lrint(x[i] * inv)) : 0;
    (i % 2 == 0 ? pair->even : pair->odd)[16 * half + i / 2] = static_cast<int8_t>(q);
    sum += q;
  }
  pair->corr[4 * half] = 12 * sum;
  const float step = finite ? static_cast<float>(amax / 254.0) : std::nanf("");
  for (int l = 0; l < 4; ++l) pair->step[4 * half + l] = step;
}

}  // namespace

int64_t Mxfp4Int8Bytes(int64_t cols) {
  return (cols + 2 * kMxfp4Group - 1) / (2 * kMxfp4Group) * int64_t{sizeof(Int8Pair)};
}

void QuantizeMxfp4Inputs(const float* x, int64_t x_stride, int64_t tokens, int64_t cols,
                         void* packed) {
  CHECK_EQ(cols % kMxfp4Group, 0) << "QuantizeMxfp4Inputs: cols not whole groups";
  const int64_t pairs = Mxfp4Int8Bytes(cols) / int64_t{sizeof(Int8Pair)};
  for (int64_t t = 0; t < tokens; ++t) {
    Int8Pair* out = reinterpret_cast<Int8Pair*>(static_cast<char*>(packed) +
                                                t * Mxfp4Int8Bytes(cols));
    std::memset(static_cast<void*>(out), 0, pairs * sizeof(Int8Pair));
    for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
      QuantizeGroup(x + t * x_stride + g * kMxfp4Group, static_cast<int>(g % 2), &out[g / 2]);
    }
  }
}

#if defined(__x86_64__)
namespace {

// E8M0 byte -> 2^(s - 127) as fp32 (exact; subnormal for s = 0), for a broadcast load.
const float* E8m0Floats() {
  static const float* const table = [] {
    alignas(64) static float values[256];
    for (int s = 0; s < 256; ++s) values[s] = E8m0Scale(static_cast<uint8_t>(s));
    return values;
  }();
  return table;
}

// Rows [row, row + R) for T tokens; xp[t] is token t's Int8Pair array (as const float*).
template <int T, int R, int P>
K3_AVX2 void Int8Block(const x86::Mxfp4Rows* w, int64_t cols, const float* const* xp,
                       float* const* yt, bool accumulate, int64_t row) {
  static_assert(P == 1, "MXFP4 rows are read one per stream");
  // u_c = 2 v_c + 12 for the 16 codes, in both 128-bit lanes.
  const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i low_nibble = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const float* scale_values = E8m0Floats();
  const Int8Pair* x[T];
  for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const Int8Pair*>(xp[t]);
  const uint8_t* codes[R];
  const uint8_t* scales[R];
  for (int r = 0; r < R; ++r) {
    codes[r] = w->codes + (row + r) * cols / 2;
    scales[r] = w->scales + (row + r) * cols / kMxfp4Group;
  }
  __m256 acc[R][T];
  x86::ZeroAccumulators(acc);
  const int64_t groups = cols / kMxfp4Group;
  for (int64_t g = 0; g < groups; g += 2) {
    const bool whole = g + 1 < groups;
    if (g % 4 == 0) {
      for (int r = 0; r < R; ++r) x86::PrefetchRowAhead<R>(codes[r], g * 16, cols / 2);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* c = codes[r] + g * 16;
      // Lane 0: group g's 16 code bytes; lane 1: group g + 1's (zero past the row's end).
      const __m256i bytes =
          whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))
                : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
      const __m256i even = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, low_nibble));
      const __m256i odd =
          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble));
      const __m256 scale = _mm256_insertf128_ps(
          _mm256_castps128_ps256(_mm_broadcast_ss(scale_values + scales[r][g])),
          _mm_broadcast_ss(scale_values + scales[r][whole ? g + 1 : g]), 1);
      for (int t = 0; t < T; ++t) {
        const Int8Pair& a = x[t][g / 2];
        const __m256i pairs = _mm256_add_epi16(
            _mm256_maddubs_epi16(even, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.even))),
            _mm256_maddubs_epi16(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.odd))));
        const __m256i sums =
            _mm256_sub_epi32(_mm256_madd_epi16(pairs, ones),
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(a.corr)));
        const __m256 step = _mm256_mul_ps(scale, _mm256_load_ps(a.step));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), step, acc[r][t]);
      }
    }
  }
  // The same fixed reduction of each accumulator's 8 lanes for every block shape.
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc[r][t]),
                                     _mm256_extractf128_ps(acc[r][t], 1));
      const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
      const float sum = _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
      float& out = yt[t][row + r];
      out = accumulate ? out + sum : sum;
    }
  }
}

// x86::RowsRange's family: R * T <= 8 accumulators.
struct Int8Family : x86::RowBlockShape<4, 8, 4, 2, 2> {
  template <int T, int R, int P, typename... Args>
  K3_AVX2 static void Block(Args... args) { Int8Block<T, R, P>(args...); }
};

}  // namespace

void Mxfp4Int8Rows(const WeightMatrix& w, const float* const* xp, float* const* yt,
                   int64_t tokens, bool accumulate, int64_t row_begin, int64_t row_end) {
  const x86::Mxfp4Rows rows{static_cast<const uint8_t*>(w.data), w.scales};
  x86::RowsRange<Int8Family>(&rows, w.cols, xp, yt, tokens, accumulate, row_begin, row_end);
}

#else  // !defined(__x86_64__)

void Mxfp4Int8Rows(const WeightMatrix&, const float* const*, float* const*, int64_t, bool,
                   int64_t, int64_t) {
  LOG(FATAL) << "MXFP4 int8 kernel called on a non-x86 build";
}

#endif

}  // namespace k3::internal
