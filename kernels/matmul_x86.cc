#if defined(__x86_64__)

#include "kernels/matmul_x86.h"

#include <cstring>

#include "kernels/mxfp4.h"

namespace k3::internal::x86 {

const uint32_t* ScaledE2m1Bits() {
  static const uint32_t* const tables = [] {
    alignas(64) static uint32_t bits[256 * 16];
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 16; ++c) {
        const float value = kE2m1Values[c] * E8m0Scale(static_cast<uint8_t>(s));
        std::memcpy(&bits[s * 16 + c], &value, 4);
      }
    }
    return bits;
  }();
  return tables;
}

}  // namespace k3::internal::x86

#endif
