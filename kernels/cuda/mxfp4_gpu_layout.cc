#include "kernels/cuda/mxfp4_gpu_layout.h"

#include <cstring>

namespace k3 {
namespace {

uint8_t CodeAt(const Mxfp4HostMatrix& m, int64_t row, int64_t col) {
  return (m.codes[row * (m.cols / 2) + col / 2] >> (4 * (col % 2))) & 0xf;
}

uint8_t ScaleAt(const Mxfp4HostMatrix& m, int64_t row, int64_t group) {
  return m.scales[row * (m.cols / 32) + group];
}

}  // namespace

bool GpuMxfp4ShapeOk(int64_t rows, int64_t cols) {
  return rows > 0 && cols > 0 && rows % kGpuTileRows == 0 && cols % kGpuTileInputs == 0;
}

void RepackMxfp4ForGpu(const Mxfp4HostMatrix& m, uint8_t* codes_out, uint8_t* scales_out) {
  const int64_t row_tiles = m.rows / kGpuTileRows;
  const int64_t input_tiles = m.cols / kGpuTileInputs;
  for (int64_t mt = 0; mt < row_tiles; ++mt) {
    for (int64_t kc = 0; kc < input_tiles; ++kc) {
      const int64_t tile = mt * input_tiles + kc;
      uint8_t* codes = codes_out + tile * kGpuTileCodeBytes;
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 4; ++j) {
          uint32_t word = 0;
          for (int p = 0; p < 4; ++p) {
            for (int half = 0; half < 2; ++half) {
              const int64_t row = mt * kGpuTileRows + FragmentRow(lane, p);
              const int64_t col = kc * kGpuTileInputs + j * 16 + FragmentInput(lane, p) + half;
              word |= Mxfp4CodeBits(p, half, CodeAt(m, row, col));
            }
          }
          // Little-endian, as the GPU reads it.
          for (int b = 0; b < 4; ++b) codes[lane * 16 + j * 4 + b] = (word >> (8 * b)) & 0xff;
        }
      }
      uint8_t* scales = scales_out + tile * kGpuTileScaleBytes;
      for (int g = 0; g < 8; ++g) {
        const int64_t row = mt * kGpuTileRows + g;
        scales[g * 4 + 0] = ScaleAt(m, row, 2 * kc);
        scales[g * 4 + 1] = ScaleAt(m, row, 2 * kc + 1);
        scales[g * 4 + 2] = ScaleAt(m, row + 8, 2 * kc);
        scales[g * 4 + 3] = ScaleAt(m, row + 8, 2 * kc + 1);
      }
    }
  }
}

}  // namespace k3
