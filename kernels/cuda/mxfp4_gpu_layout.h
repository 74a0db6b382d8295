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
// The repacked matrix stores exactly those codes in lane order, so each lane reads its A
// fragments of four MMA steps (64 inputs) with one 16-byte load, the warp's 512 bytes contiguous:
//
//   codes: tiles of 16 rows x 64 inputs, row tile major: tile (mt, kc) at byte (mt * K/64 + kc) *
//     512; in it lane L's 16 bytes at L * 16, as four little-endian 32-bit words, word j for inputs
//     kc*64 + j*16 + [0, 16): the eight E2M1 codes of the lane's four registers a_0..a_3 (two
//     each: half 0 the even input, half 1 the odd one), their 32 bits scattered over the word
//     (Mxfp4CodeBitPosition) so that register p is one rotation of the word and one mask away
//     from its bf16x2 bits (p = 3: two rotations, masks and an OR; Mxfp4PairBits). A code (s e1 e0
//     m) becomes the bf16 with sign s, exponent field e1 e0 and top mantissa bit m, bits 15, 8,
//     7 and 6 of its half: the word holds each code bit where rotating the word brings it there.
//     Per word that is 4 rotations (one of them by 0, free), 5 masks, 1 OR and 4 bf16x2 multiplies
//     (13 instructions) where four nibbles shifted into place took 19.
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

// Fragment register p of a lane: its row offset in the tile (0..15) and its first input (0..15).
K3_HOST_DEVICE constexpr int FragmentRow(int lane, int p) { return lane / 4 + (p % 2) * 8; }
K3_HOST_DEVICE constexpr int FragmentInput(int lane, int p) { return 2 * (lane % 4) + (p / 2) * 8; }

// The bf16 bit (of a half) that code bit b takes: b = 0 (m) -> 6, 1 (e0) -> 7, 2 (e1) -> 8, 3 (s)
// -> 15.
K3_HOST_DEVICE constexpr int Mxfp4Bf16Bit(int b) { return b == 3 ? 15 : 6 + b; }

// The left rotation of a codes word that brings code bit b of register p to its bf16 bit:
// registers 0, 1, 2 take one rotation each (0, 4, 10); register 3 takes 6 for its m bits and 14
// for the others. One rotation per register cannot work: an exhaustive search finds no four
// disjoint rotations (nor shifts) of the 8-bit mask, so one register takes two.
K3_HOST_DEVICE constexpr int Mxfp4Rotation(int p, int b) {
  return p == 0 ? 0 : p == 1 ? 4 : p == 2 ? 10 : (b == 0 ? 6 : 14);
}

// The word bit that holds code bit b (0..3) of register p's element `half` (0: even input, 1: odd).
// Every (p, half, b) has its own bit (mxfp4_gpu_layout_test checks the 32 are a permutation).
K3_HOST_DEVICE constexpr int Mxfp4CodeBitPosition(int p, int half, int b) {
  return (16 * half + Mxfp4Bf16Bit(b) - Mxfp4Rotation(p, b) + 32) % 32;
}

// The word bits of one code (0..15) as register p's element `half`.
K3_HOST_DEVICE constexpr uint32_t Mxfp4CodeBits(int p, int half, uint32_t code) {
  uint32_t bits = 0;
  for (int b = 0; b < 4; ++b) bits |= ((code >> b) & 1u) << Mxfp4CodeBitPosition(p, half, b);
  return bits;
}

K3_HOST_DEVICE inline uint32_t RotateLeft(uint32_t x, int n) {
  if (n == 0) return x;  // folded away where n is a constant (the intrinsic below is opaque asm)
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(x, x, n);  // one SHF.L.W
#else
  return (x << n) | (x >> ((32 - n) & 31));
#endif
}

// The bf16x2 bit pattern of register p from a codes word: each code's value times 2^-126 (e = 0,
// m = 1 is the bf16 subnormal 2^-127 = 0.5 * 2^-126). One bf16x2 multiply by 2^126
// (kBf16TwoTo126, exact, subnormals included) gives the code values.
K3_HOST_DEVICE inline uint32_t Mxfp4PairBits(uint32_t word, int p) {
  constexpr uint32_t kCodeBits = 0x81c081c0u;  // bits 15, 8, 7, 6 of each half
  constexpr uint32_t kMantissa = 0x00400040u;  // bit 6 of each half
  if (p == 3) {
    return (RotateLeft(word, Mxfp4Rotation(3, 0)) & kMantissa) |
           (RotateLeft(word, Mxfp4Rotation(3, 1)) & (kCodeBits & ~kMantissa));
  }
  return RotateLeft(word, Mxfp4Rotation(p, 0)) & kCodeBits;
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
