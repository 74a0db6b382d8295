#include "model/mxfp4_quantize.h"

#include <algorithm>
#include <cmath>

#include "kernels/mxfp4.h"

namespace k3 {
namespace {

// The scale byte of a group whose largest magnitude is `amax`.
uint8_t GroupScale(float amax) {
  if (amax == 0.0f) return 127;
  // The smallest k with 6 * 2^k >= amax.
  int k = std::ilogb(amax / 6.0f);
  if (std::ldexp(6.0f, k) < amax) ++k;
  return static_cast<uint8_t>(std::clamp(k + 127, 0, static_cast<int>(kMxfp4MaxScale)));
}

// The code nearest to value / scale (ties to the even code).
uint8_t NearestCode(float value, float scale) {
  uint8_t best = 0;
  float best_error = INFINITY;
  const uint8_t sign = std::signbit(value) ? 8 : 0;
  for (uint8_t code = 0; code < 8; ++code) {
    const float error = std::abs(std::abs(value) - kE2m1Values[code] * scale);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = code;
      best_error = error;
    }
  }
  return best | sign;
}

}  // namespace

Mxfp4Bytes QuantizeMxfp4(const float* values, int64_t rows, int64_t cols) {
  Mxfp4Bytes out;
  out.codes.assign(rows * cols / 2, '\0');
  out.scales.assign(rows * cols / kMxfp4Group, '\0');
  for (int64_t g = 0; g < rows * cols / kMxfp4Group; ++g) {
    const float* group = values + g * kMxfp4Group;
    float amax = 0.0f;
    for (int64_t i = 0; i < kMxfp4Group; ++i) amax = std::max(amax, std::abs(group[i]));
    const uint8_t s = GroupScale(amax);
    out.scales[g] = static_cast<char>(s);
    const float scale = E8m0Scale(s);
    for (int64_t i = 0; i < kMxfp4Group; ++i) {
      const uint8_t code = NearestCode(group[i], scale);
      out.codes[(g * kMxfp4Group + i) / 2] |= static_cast<char>(code << (4 * (i % 2)));
    }
  }
  return out;
}

}  // namespace k3
