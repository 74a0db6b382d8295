// MXFP4 x bf16 expert kernels (kernels/cuda/moe_mxfp4.h), Hopper sm_90a.
//
// Per warp: 16 weight rows (of one or two matrices, "streams") times all of a chunk's tokens, over
// the whole input width. Each lane reads its A fragments of 64 inputs with one 16-byte load per
// stream (the repacked layout puts them there), kDepth such loads ahead in a register ring so
// that enough bytes are in flight to cover the memory latency, and the activations (bf16, a few
// rows, L1/L2-resident) as B fragments with 4-byte loads. Codes become bf16 by a rotation and a
// mask of their word and one exact bf16x2 multiply (Mxfp4PairBits); a group's E8M0 scale
// multiplies its two MMAs' fp32 sums (exact: a power of two), so each product is code x bf16(x)
// accumulated in fp32 as on the CPU, whose fp32 x values differ only by their rounding to bf16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/moe_mxfp4.h"
// After the header: the combine's device code (shared with the CPU emulation test).
#include "kernels/cuda/moe_combine_kernel.inc"

namespace k3 {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;

// D = A B + D, A 16x16 bf16 (row), B 16x8 bf16 (col), D fp32.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The four A registers of one MMA step from one codes word (layout in mxfp4_gpu_layout.h).
__device__ __forceinline__ void DequantWord(uint32_t word, uint32_t (&a)[4]) {
  constexpr uint32_t kScale = (uint32_t{kBf16TwoTo126} << 16) | kBf16TwoTo126;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t bits = Mxfp4PairBits(word, p);
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(a[p]) : "r"(bits), "r"(kScale));
  }
}

// 2^(s - 127) for an E8M0 byte s <= kMxfp4MaxScale (s = 0: the fp32 subnormal 2^-127).
__device__ __forceinline__ float E8m0ToFloat(uint32_t s) {
  return __uint_as_float(s == 0 ? 0x00400000u : s << 23);
}

__device__ __forceinline__ uint4 LoadStreaming16(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint32_t LoadStreaming4(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const unsigned int*>(p));
}

__device__ __forceinline__ uint32_t LoadActivations(const uint16_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// One warp's product: acc[s][nt][i] += Σ_k W_s[mt*16 + row(i), k] x[token(nt, i), k], with
// row(i) = lane/4 + 8 (i >= 2) and token(nt, i) = nt*8 + 2 (lane%4) + (i & 1), the C fragment of
// mma.m16n8k16. `codes[s]`/`scales[s]` point at row tile mt's first tile of stream s; x holds
// `tokens` rows of `x_stride` bf16 (rows past `tokens` read the last one; their sums are unused).
template <int kStreams, int kTiles, int kDepth>
__device__ __forceinline__ void WarpProduct(const uint8_t* const (&codes)[kStreams],
                                            const uint8_t* const (&scales)[kStreams],
                                            int input_tiles, const uint16_t* x, int x_stride,
                                            int tokens, float (&acc)[kStreams][kTiles][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint16_t* rows[kTiles];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    rows[nt] = x + static_cast<int64_t>(min(nt * 8 + g, tokens - 1)) * x_stride + 2 * t;
  }
  uint4 ring[kDepth][kStreams];
  uint32_t ring_scales[kDepth][kStreams];
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    if (d < input_tiles) {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        ring[d][s] = LoadStreaming16(codes[s] + d * kGpuTileCodeBytes + lane * 16);
        ring_scales[d][s] = LoadStreaming4(scales[s] + d * kGpuTileScaleBytes + g * 4);
      }
    }
  }
  for (int kc0 = 0; kc0 < input_tiles; kc0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int kc = kc0 + d;
      if (kc >= input_tiles) break;
      uint4 tile[kStreams];
      uint32_t tile_scales[kStreams];
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        tile[s] = ring[d][s];
        tile_scales[s] = ring_scales[d][s];
      }
      if (kc + kDepth < input_tiles) {  // refill the slot just taken
#pragma unroll
        for (int s = 0; s < kStreams; ++s) {
          ring[d][s] = LoadStreaming16(codes[s] + (kc + kDepth) * kGpuTileCodeBytes + lane * 16);
          ring_scales[d][s] =
              LoadStreaming4(scales[s] + (kc + kDepth) * kGpuTileScaleBytes + g * 4);
        }
      }
#pragma unroll
      for (int group = 0; group < 2; ++group) {  // 32 inputs share a scale
        // B fragments of the group's 2 MMA steps: inputs kc*64 + j*16 + {2t, 2t+1}, {2t+8, 2t+9}.
        uint32_t b[2][kTiles][2];
#pragma unroll
        for (int step = 0; step < 2; ++step) {
#pragma unroll
          for (int nt = 0; nt < kTiles; ++nt) {
            const uint16_t* k = rows[nt] + kc * 64 + (group * 2 + step) * 16;
            b[step][nt][0] = LoadActivations(k);
            b[step][nt][1] = LoadActivations(k + 8);
          }
        }
#pragma unroll
        for (int s = 0; s < kStreams; ++s) {
          float part[kTiles][4] = {};
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            const int j = group * 2 + step;
            const uint32_t word = j == 0 ? tile[s].x : j == 1 ? tile[s].y : j == 2 ? tile[s].z
                                                                                   : tile[s].w;
            uint32_t a[4];
            DequantWord(word, a);
#pragma unroll
            for (int nt = 0; nt < kTiles; ++nt) Mma(part[nt], a, b[step][nt][0], b[step][nt][1]);
          }
          const float scale_g = E8m0ToFloat((tile_scales[s] >> (8 * group)) & 0xff);
          const float scale_g8 = E8m0ToFloat((tile_scales[s] >> (8 * (2 + group))) & 0xff);
#pragma unroll
          for (int nt = 0; nt < kTiles; ++nt) {
            acc[s][nt][0] = fmaf(scale_g, part[nt][0], acc[s][nt][0]);
            acc[s][nt][1] = fmaf(scale_g, part[nt][1], acc[s][nt][1]);
            acc[s][nt][2] = fmaf(scale_g8, part[nt][2], acc[s][nt][2]);
            acc[s][nt][3] = fmaf(scale_g8, part[nt][3], acc[s][nt][3]);
          }
        }
      }
    }
  }
}

// Register ring depth: 8 16-byte loads in flight per lane with 8 tokens; fewer where the
// accumulators of more tokens need the registers (ptxas -warn-spills fails the build on a spill,
// within the 128 registers that 4 blocks of 128 threads per multiprocessor leave).
template <int kStreams, int kTiles>
constexpr int RingDepth() {
  if (kStreams == 1) return kTiles == 4 ? 4 : 8;
  return kTiles == 1 ? 4 : 2;
}

// Calls out(nt, i, token, row) for each accumulator [nt][i] of this lane's warp tile `mt` that
// holds one of the chunk's tokens: in the m16n8 accumulator layout, value i of token tile nt is
// token nt * 8 + 2 (lane % 4) + (i & 1) of output row lane / 4 (+ 8 for i >= 2) of the tile.
template <int kTiles, typename Out>
__device__ __forceinline__ void ForEachOutput(const MoeChunk& chunk, int mt, const Out& out) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = nt * 8 + 2 * (lane % 4) + (i & 1);
      if (token >= chunk.tokens) continue;
      out(nt, i, token, mt * kGpuTileRows + lane / 4 + (i >= 2 ? 8 : 0));
    }
  }
}

// A warp's work in GateUpKernel or DownKernel: chunk blockIdx.x's tokens through row tile `mt`
// of one matrix of the chunk's expert; first_tile is the tile's first input tile in the GPU
// layout (input_tiles per row tile), the offset of its codes and scales in every matrix.
struct WarpWork {
  MoeChunk chunk;
  Mxfp4DeviceExpert expert;
  int mt;
  int input_tiles;
  int64_t first_tile;
};

// This warp's work on a matrix of `rows` rows of `inputs` inputs; false for the warps past its
// last row tile (the grid counts whole blocks of warps).
__device__ __forceinline__ bool WarpWorkOf(const MoeMxfp4Launch& p, int rows, int inputs,
                                           WarpWork* w) {
  w->chunk = p.chunks[blockIdx.x];
  w->mt = blockIdx.y * kWarpsPerBlock + threadIdx.x / 32;
  // Empty chunks pad a device-grouped call to its host-known bound (moe_group.h).
  if (w->mt >= rows / kGpuTileRows || w->chunk.tokens == 0) return false;
  w->expert = p.experts[w->chunk.expert];
  w->input_tiles = inputs / kGpuTileInputs;
  w->first_tile = static_cast<int64_t>(w->mt) * w->input_tiles;
  return true;
}

// 32 tokens' two sets of accumulators take more than 128 registers: 2 blocks per multiprocessor.
template <int kTiles>
__global__ void __launch_bounds__(kThreads, kTiles == 4 ? 2 : 4) GateUpKernel(MoeMxfp4Launch p) {
  WarpWork w;
  if (!WarpWorkOf(p, p.hidden, p.width, &w)) return;
  const MoeChunk& chunk = w.chunk;
  const uint8_t* const codes[2] = {w.expert.gate.codes + w.first_tile * kGpuTileCodeBytes,
                                   w.expert.up.codes + w.first_tile * kGpuTileCodeBytes};
  const uint8_t* const scales[2] = {w.expert.gate.scales + w.first_tile * kGpuTileScaleBytes,
                                    w.expert.up.scales + w.first_tile * kGpuTileScaleBytes};
  float acc[2][kTiles][4] = {};
  WarpProduct<2, kTiles, RingDepth<2, kTiles>()>(
      codes, scales, w.input_tiles, p.x + static_cast<int64_t>(chunk.first_slot) * p.width,
      p.width, chunk.tokens, acc);
  ForEachOutput<kTiles>(chunk, w.mt, [&](int nt, int i, int token, int row) {
    const float value = GpuGluCombine(p.glu, acc[0][nt][i], acc[1][nt][i]);
    p.h[static_cast<int64_t>(chunk.first_slot + token) * p.hidden + row] =
        __bfloat16_as_ushort(__float2bfloat16_rn(value));
  });
}

template <int kTiles>
__global__ void __launch_bounds__(kThreads, 4) DownKernel(MoeMxfp4Launch p) {
  WarpWork w;
  if (!WarpWorkOf(p, p.width, p.hidden, &w)) return;
  const MoeChunk& chunk = w.chunk;
  const uint8_t* const codes[1] = {w.expert.down.codes + w.first_tile * kGpuTileCodeBytes};
  const uint8_t* const scales[1] = {w.expert.down.scales + w.first_tile * kGpuTileScaleBytes};
  float acc[1][kTiles][4] = {};
  WarpProduct<1, kTiles, RingDepth<1, kTiles>()>(
      codes, scales, w.input_tiles, p.h + static_cast<int64_t>(chunk.first_slot) * p.hidden,
      p.hidden, chunk.tokens, acc);
  ForEachOutput<kTiles>(chunk, w.mt, [&](int nt, int i, int token, int row) {
    const int slot = chunk.first_slot + token;
    p.slot_out[static_cast<int64_t>(slot) * p.width + row] = p.slot_weight[slot] * acc[0][nt][i];
  });
}

__global__ void DequantProbeKernel(const uint32_t* words, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t a[4];
  DequantWord(words[i], a);
  for (int p = 0; p < 4; ++p) out[4 * i + p] = a[p];
}

template <int kTiles>
int Launch(const MoeMxfp4Launch& p, cudaStream_t stream) {
  const int hidden_tiles = p.hidden / kGpuTileRows, width_tiles = p.width / kGpuTileRows;
  const dim3 gate_up_grid(p.chunk_count, (hidden_tiles + kWarpsPerBlock - 1) / kWarpsPerBlock);
  GateUpKernel<kTiles><<<gate_up_grid, kThreads, 0, stream>>>(p);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const dim3 down_grid(p.chunk_count, (width_tiles + kWarpsPerBlock - 1) / kWarpsPerBlock);
  DownKernel<kTiles><<<down_grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

int LaunchCombine(const MoeMxfp4Launch& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  MoeCombineKernel<<<p.rows, kMoeCombineThreads, 0, stream>>>(p.slot_out, p.width, p.row_slots,
                                                               p.per_row, p.out);
  return cudaGetLastError();
}

}  // namespace

int LaunchMxfp4DequantProbe(const uint32_t* words, uint32_t* out, int n, void* stream) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  DequantProbeKernel<<<(n + 127) / 128, 128, 0, static_cast<cudaStream_t>(stream)>>>(words, out, n);
  return cudaGetLastError();
}

int LaunchMoeMxfp4(const MoeMxfp4Launch& launch, void* stream) {
  if (launch.width <= 0 || launch.hidden <= 0 || launch.width % kGpuTileInputs != 0 ||
      launch.hidden % kGpuTileInputs != 0 || launch.chunk_count < 0 || launch.rows < 0 ||
      launch.per_row < 0 ||
      (launch.chunk_tokens != 8 && launch.chunk_tokens != 16 && launch.chunk_tokens != 32)) {
    return cudaErrorInvalidValue;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (launch.chunk_count > 0) {
    const int status = launch.chunk_tokens == 8    ? Launch<1>(launch, s)
                       : launch.chunk_tokens == 16 ? Launch<2>(launch, s)
                                                   : Launch<4>(launch, s);
    if (status != cudaSuccess) return status;
  }
  return LaunchCombine(launch, s);
}

}  // namespace k3
