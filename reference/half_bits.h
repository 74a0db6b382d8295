// BF16 and IEEE binary16 bit patterns decoded to double, field by field from the formats'
// definitions. The reference's own decode: it shares nothing with kernels/bf16.h, the code under
// test. Exact (every such value is a double); NaN payloads are not kept.
#ifndef K3SERVE_REFERENCE_HALF_BITS_H_
#define K3SERVE_REFERENCE_HALF_BITS_H_

#include <cmath>
#include <cstdint>
#include <limits>

namespace k3::reference {

// A 16-bit binary float of 1 sign bit, `exponent_bits` and `mantissa_bits`, IEEE 754 style.
inline double DecodeBinary16(uint16_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                              : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {  // subnormal or zero
    magnitude = std::ldexp(mantissa, 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(mantissa + (1 << mantissa_bits), exponent - bias - mantissa_bits);
  }
  return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

inline double Bf16ToDouble(uint16_t bits) { return DecodeBinary16(bits, 8, 7); }
inline double HalfToDouble(uint16_t bits) { return DecodeBinary16(bits, 5, 10); }

}  // namespace k3::reference

#endif  // K3SERVE_REFERENCE_HALF_BITS_H_
