// 16-lane float vectors for the hot loops of RMSNorm and the attention mixers, written with GCC
// vector extensions so that one source compiles to AVX-512, AVX2 or SSE2 per function clone
// (K3_VECTOR_CLONES).
//
// Everything here is forced inline: compiled inside each clone with that clone's instruction set.
// An out-of-line copy would be built for baseline x86-64 and pass 64-byte vectors in a different
// register convention than an AVX-512 caller expects.
#ifndef K3SERVE_KERNELS_SIMD_H_
#define K3SERVE_KERNELS_SIMD_H_

#include <cstdint>
#include <cstring>

// Marks a hot function to be compiled for AVX-512, AVX2 and baseline x86-64; the loader picks one
// per CPU. Inside such a function, Vec16 arithmetic uses the widest registers available.
// Not under ThreadSanitizer (--config=tsan defines K3SERVE_TSAN): it would instrument the clones'
// resolver, which the loader runs before the sanitizer's runtime is up (a crash at start).
#ifdef K3SERVE_TSAN
#define K3_VECTOR_CLONES
#else
#define K3_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

#define K3_SIMD_INLINE inline __attribute__((always_inline))

namespace k3::simd {

typedef float Vec16 __attribute__((vector_size(64)));
typedef int32_t Int16x __attribute__((vector_size(64)));

inline constexpr int kWidth = 16;

// Unaligned loads and stores (memcpy compiles to one vector move).
K3_SIMD_INLINE Vec16 Load(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
K3_SIMD_INLINE void Store(float* p, Vec16 v) { std::memcpy(p, &v, sizeof(v)); }
K3_SIMD_INLINE Vec16 Splat(float x) { return Vec16{} + x; }

K3_SIMD_INLINE float Sum(Vec16 v) {
  // Pairwise halving: four shuffle+add steps instead of fifteen dependent scalar adds.
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  const Vec8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 s4 =
      __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// e^x to about 2 ulp (Cephes' expf polynomial after x = n·ln2 + r); 0 below -87.3, where fp32
// denormals would start, and +inf above 88.7.
K3_SIMD_INLINE Vec16 Exp(Vec16 x) {
  const Vec16 lo = Splat(-87.33654f), hi = Splat(88.72283f);
  const Vec16 xc = x < lo ? lo : (x > hi ? hi : x);
  // n = round(x / ln2) by the 1.5·2^23 trick (exact for |n| < 2^22).
  const Vec16 shifter = Splat(12582912.0f);
  const Vec16 n = (xc * 1.44269504088896341f + shifter) - shifter;
  Vec16 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec16 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Multiply by 2^n in two halves so that n = 128 (x near 88.7) does not overflow the exponent.
  const Int16x ni = __builtin_convertvector(n, Int16x);
  const Int16x half = ni >> 1;
  const Int16x bits1 = (half + 127) << 23, bits2 = (ni - half + 127) << 23;
  Vec16 s1, s2;
  std::memcpy(&s1, &bits1, sizeof(s1));
  std::memcpy(&s2, &bits2, sizeof(s2));
  const Vec16 y = p * s1 * s2;
  return x < lo ? Splat(0.0f) : (x > hi ? Splat(__builtin_inff()) : y);
}

}  // namespace k3::simd

#endif  // K3SERVE_KERNELS_SIMD_H_
