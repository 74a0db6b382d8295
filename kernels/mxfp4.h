// MXFP4 weights as the K3 release stores them (compressed-tensors "mxfp4-pack-quantized", OCP
// Microscaling; spec §10): each group of 32 consecutive inputs of a row shares one E8M0 scale byte
// s (value 2^(s - 127)); each weight is a 4-bit E2M1 code (bit 3 = sign; magnitudes 0, 0.5, 1, 1.5,
// 2, 3, 4, 6), two per byte with element 2i in the low nibble and 2i + 1 in the high one.
//
// Every code times every scale up to kMxfp4MaxScale is exact in fp32 (s = 0 gives 2^-127 and its
// multiples, fp32 subnormals, still exact), so decoding loses nothing. Scale byte 255 is NaN in the
// MX standard, and 253 and 254 overflow fp32 for the larger codes (6 * 2^127 > FLT_MAX): loaders
// reject bytes above kMxfp4MaxScale, so kernels never see them.
#ifndef K3SERVE_KERNELS_MXFP4_H_
#define K3SERVE_KERNELS_MXFP4_H_

#include <cmath>
#include <cstdint>
#include <limits>

namespace k3 {

// Inputs per shared scale.
inline constexpr int64_t kMxfp4Group = 32;
// The E8M0 byte that encodes NaN.
inline constexpr uint8_t kMxfp4NanScale = 255;
// The largest scale byte whose products with every code are finite in fp32 (6 * 2^125).
inline constexpr uint8_t kMxfp4MaxScale = 252;

// E2M1 code -> value.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E8M0 scale byte -> 2^(s - 127); NaN for 255.
inline float E8m0Scale(uint8_t s) {
  if (s == kMxfp4NanScale) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

// Element c of one MXFP4 row: `codes` holds the row's cols / 2 bytes, `scales` its cols / 32.
inline float Mxfp4Element(const uint8_t* codes, const uint8_t* scales, int64_t c) {
  const uint8_t code = (codes[c / 2] >> (4 * (c % 2))) & 0xf;
  return kE2m1Values[code] * E8m0Scale(scales[c / kMxfp4Group]);
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_MXFP4_H_
