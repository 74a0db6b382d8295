// Rounding fp32 weights to MXFP4 (spec §10, kernels/mxfp4.h), for writing MXFP4 checkpoints.
//
// Each group of 32 inputs of a row gets the smallest scale 2^(s - 127) that keeps its largest
// magnitude within E2M1's range (6 * scale), so nothing clips (the OCP reference instead takes
// 2^(floor(log2 max) - 2) and clips); each value then rounds to the nearest E2M1 value times the
// scale, ties to the even code. An all-zero group gets scale byte 127. Scale bytes are clamped to
// [0, kMxfp4MaxScale]. Pure function; thread-safe.
#ifndef K3SERVE_MODEL_MXFP4_QUANTIZE_H_
#define K3SERVE_MODEL_MXFP4_QUANTIZE_H_

#include <cstdint>
#include <string>

namespace k3 {

struct Mxfp4Bytes {
  std::string codes;   // [rows, cols / 2], element 2i in the low nibble
  std::string scales;  // [rows, cols / 32] E8M0
};

// REQUIRES: cols % kMxfp4Group == 0; values finite.
Mxfp4Bytes QuantizeMxfp4(const float* values, int64_t rows, int64_t cols);

}  // namespace k3

#endif  // K3SERVE_MODEL_MXFP4_QUANTIZE_H_
