// The layout of an MXFP4 weight matrix in GPU memory, chosen for the expert kernels
// (kernels/cuda/moe_mxfp4.cu), and the host-side repack from the release's layout
// (kernels/mxfp4.h).
//
// The kernels compute C^T = W X^T with `mma.sync.m16n8k16` (bf16 in, fp32 accumulate): the weights
// are the MMA's A operand (16 rows x 16 inputs), the few tokens its B operand (16 inputs x 8
// tokens). Each lane of a warp holds a fixed part of A (PTX ISA, "Matrix Fragments for
// mma.m16n8k16" with .bf16): with g = lane / 4 and t = lane % 4,
//   a0 = rows g,   inputs 2t, 2t+1       a1 = rows g+8, inputs 2t, 2t+1
//   a2 = rows g,   inputs 2t+8, 2t+9     a3 = rows g+8, inputs 2t+8, 2t+9
// The repacked matrix stores exactly those nibbles in lane order, so each lane reads its A
// fragments of four MMA steps (64 inputs) with one 16-byte load, the warp's 512 bytes contiguous:
//
//   codes: tiles of 16 rows x 64 inputs, row tile major: tile (mt, kc) at byte (mt * K/64 + kc) *
//     512; in it lane L's 16 bytes at L * 16, as four little-endian 32-bit words, word j for inputs
//     kc*64 + j*16 + [0, 16). Word nibble positions (bits 4p..4p+3) hold the E2M1 codes
//       3: (g, 2t)    7: (g, 2t+1)    2: (g+8, 2t)    6: (g+8, 2t+1)
//       1: (g, 2t+8)  5: (g, 2t+9)    0: (g+8, 2t+8)  4: (g+8, 2t+9)
//     so that a_p is the pair at positions (3 - p, 7 - p), brought to bits 12..15 and 28..31 by one
//     shift left of 4p (Mxfp4PairBits).
//   scales: E8M0 bytes, 32 per tile (mt, kc) at byte (mt * K/64 + kc) * 32; in it, at g * 4: rows
//     g and g+8, groups 2kc and 2kc+1, as [row g grp 2kc, row g grp 2kc+1, row g+8 grp 2kc,
//     row g+8 grp 2kc+1], one 4-byte load per lane.
//
// Same bytes as the release (0.5 B per weight plus one scale per 32), only permuted. Rows must be
// a multiple of 16 and inputs of 64 (K3 and every config of the spec qualify).
#ifndef K3SERVE_KERNELS_CUDA_MXFP4_GPU_LAYOUT_H_
#define K3SERVE_KERNELS_CUDA_MXFP4_GPU_LAYOUT_H_

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define K3_HOST_DEVICE __host__ __device__
#else
#define K3_HOST_DEVICE
#endif

namespace k3 {

inline constexpr int64_t kGpuTileRows = 16;
inline constexpr int64_t kGpuTileInputs = 64;
inline constexpr int64_t kGpuTileCodeBytes = 512;
inline constexpr int64_t kGpuTileScaleBytes = 32;

// The word nibble position that holds fragment register p's element (half = 0: the even input,
// 1: the odd one) of lane (g, t), per the table above.
K3_HOST_DEVICE constexpr int Mxfp4NibblePosition(int p, int half) { return 3 - p + 4 * half; }

// Fragment register p of a lane: its row offset in the tile (0..15) and its first input (0..15).
K3_HOST_DEVICE constexpr int FragmentRow(int lane, int p) { return lane / 4 + (p % 2) * 8; }
K3_HOST_DEVICE constexpr int FragmentInput(int lane, int p) { return 2 * (lane % 4) + (p / 2) * 8; }

// The bf16x2 bit pattern of register p from a codes word: each E2M1 code (s e1 e0 m) becomes the
// bf16 with sign s, exponent field e1 e0 and top mantissa bit m, whose value is exactly the code's
// value times 2^-126 (e = 0, m = 1 is the bf16 subnormal 2^-127 = 0.5 * 2^-126). One bf16x2
// multiply by 2^126 (kBf16TwoTo126, exact, subnormals included) gives the code values.
K3_HOST_DEVICE inline uint32_t Mxfp4PairBits(uint32_t word, int p) {
  const uint32_t x = word << (4 * p);
  return (x & 0x80008000u) | ((x & 0x70007000u) >> 6);
}
inline constexpr uint16_t kBf16TwoTo126 = 0x7e80;

// One MXFP4 matrix in the release's layout (kernels/mxfp4.h); not owned.
struct Mxfp4HostMatrix {
  const uint8_t* codes = nullptr;   // [rows, cols / 2], two codes per byte, element 2i low nibble
  const uint8_t* scales = nullptr;  // [rows, cols / 32]
  int64_t rows = 0;
  int64_t cols = 0;
};

// Byte sizes of a rows x cols matrix in the GPU layout.
inline int64_t GpuMxfp4CodeBytes(int64_t rows, int64_t cols) { return rows * cols / 2; }
inline int64_t GpuMxfp4ScaleBytes(int64_t rows, int64_t cols) { return rows * cols / 32; }

// Whether a rows x cols matrix has a GPU layout (rows % 16 == 0, cols % 64 == 0, both > 0).
bool GpuMxfp4ShapeOk(int64_t rows, int64_t cols);

// Writes `m` in the GPU layout: codes_out has GpuMxfp4CodeBytes, scales_out GpuMxfp4ScaleBytes.
// REQUIRES: GpuMxfp4ShapeOk(m.rows, m.cols).
void RepackMxfp4ForGpu(const Mxfp4HostMatrix& m, uint8_t* codes_out, uint8_t* scales_out);

// The gated-MLP activation of kernels/gated_mlp.h (GluCombine), the same formulas in fp32, for the
// kernels' epilogue; on the host it lets tests compare the two.
struct GpuGluParams {
  int situ = 1;             // 0: SwiGLU
  float beta = 4.0f;        // SiTU β
  float linear_beta = 0.f;  // λ of the up branch's soft cap; 0: uncapped
};

K3_HOST_DEVICE inline float GpuGluCombine(const GpuGluParams& p, float a, float b) {
  const float capped = p.linear_beta > 0.f ? p.linear_beta * tanhf(b / p.linear_beta) : b;
  const float sigmoid = 1.0f / (1.0f + expf(-a));
  const float activated = p.situ ? p.beta * tanhf(a / p.beta) * sigmoid : a * sigmoid;
  return activated * capped;
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_MXFP4_GPU_LAYOUT_H_
