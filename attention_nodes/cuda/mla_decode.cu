// Absorbed MLA decode (mla_decode.h), in fp32 on the CUDA cores from the bf16 cache.
//
// Split launch: block (split, head group, sequence), 128 threads, 8 heads. It walks its run of keys
// 16 at a time: the 16 cache rows go to shared memory (each bf16 pair one 4-byte load, a warp
// reading 128 contiguous bytes of a row); thread t scores head t / 16 against key t % 16 (a
// 576-term dot product with the head's query, held in shared memory); 8 threads update their
// head's running max and sum and turn the scores into weights e^{s − max}; then thread t adds the
// weighted rows into its accumulators for columns t, t + 128, t + 256, t + 384 of c, for all 8
// heads (32 registers), after rescaling them when the max grew. The block writes its partial
// (the 8 heads' accumulators, max and sum) to the workspace.
//
// Combine launch: block (head, sequence), 128 threads; each thread merges the runs for its
// columns: out = Σ_s e^{m_s − m} acc_s / Σ_s e^{m_s − m} sum_s.
//
// This is the simple form: every score is an fp32 dot product, so with K3's 96 heads (about 180
// FLOPs per byte of cache) it is bound by the CUDA cores, not by the memory. The tensor-core form
// (MlaDecodeMmaKernel below, LaunchMlaDecodeTensorCores) shares the workspace and the combine
// launch; this one is its fp32 reference.
#include "attention_nodes/cuda/mla_decode.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

namespace k3 {
namespace {

constexpr int kThreads = 128;
constexpr int kHeadsPerBlock = 8;
constexpr int kKeyTile = kMlaDecodeKeyTile;
constexpr int kColsPerThread = kMlaDecodeMaxRank / kThreads;
// Row strides in shared memory: 577 floats and 289 words (578 bf16) are odd, so the rows that one
// warp reads at the same column fall on different banks.
constexpr int kQueryStride = kMlaDecodeMaxWidth + 1;
constexpr int kTileStride = kMlaDecodeMaxWidth + 2;

static_assert(kThreads == kHeadsPerBlock * kKeyTile, "one score per thread");

__device__ float Bf16ToFloat(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

int32_t Splits(const MlaDecodeLaunch& p) {
  return (p.max_length + p.keys_per_split - 1) / p.keys_per_split;
}

__global__ void __launch_bounds__(kThreads) MlaDecodeSplitKernel(const MlaDecodeLaunch p) {
  const int split = blockIdx.x, head0 = blockIdx.y * kHeadsPerBlock, b = blockIdx.z;
  const int tid = threadIdx.x, c = p.kv_lora_rank, width = c + p.rope_dim;
  const int length = p.lengths[b];
  const int k_begin = split * p.keys_per_split;
  const int k_end = min(length, k_begin + p.keys_per_split);

  __shared__ float query[kHeadsPerBlock][kQueryStride];
  __shared__ __align__(16) uint16_t tile[kKeyTile][kTileStride];
  __shared__ float weights[kHeadsPerBlock][kKeyTile];
  __shared__ float rescale[kHeadsPerBlock], run_max[kHeadsPerBlock], run_sum[kHeadsPerBlock];

  for (int i = tid; i < kHeadsPerBlock * width; i += kThreads) {
    const int h = i / width, d = i % width;
    query[h][d] = head0 + h < p.heads ? p.q[(static_cast<int64_t>(b) * p.heads + head0 + h) * width + d]
                                      : 0.0f;
  }
  if (tid < kHeadsPerBlock) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  float acc[kHeadsPerBlock][kColsPerThread] = {};
  const int words = width / 2;  // bf16 pairs per row
  __syncthreads();

  for (int k0 = k_begin; k0 < k_end; k0 += kKeyTile) {
    const int keys = min(kKeyTile, k_end - k0);
    for (int i = tid; i < keys * words; i += kThreads) {
      const int key = i / words, w = i % words, n = k0 + key;
      const int64_t page = p.block_table[static_cast<int64_t>(b) * p.max_pages + n / p.page_size];
      const uint32_t* row = reinterpret_cast<const uint32_t*>(
          p.cache + (page * p.page_size + n % p.page_size) * width);
      reinterpret_cast<uint32_t*>(tile[key])[w] = row[w];
    }
    __syncthreads();
    {  // the score of head tid / 16 against key tid % 16
      const int h = tid / kKeyTile, key = tid % kKeyTile;
      float score = -INFINITY;
      if (key < keys && head0 + h < p.heads) {
        score = 0.0f;
#pragma unroll 8
        for (int d = 0; d < width; ++d) score += query[h][d] * Bf16ToFloat(tile[key][d]);
      }
      weights[h][key] = score;
    }
    __syncthreads();
    if (tid < kHeadsPerBlock) {  // the running softmax of head tid
      float tile_max = -INFINITY;
      for (int key = 0; key < kKeyTile; ++key) tile_max = fmaxf(tile_max, weights[tid][key]);
      if (tile_max == -INFINITY) {  // a head past H
        for (int key = 0; key < kKeyTile; ++key) weights[tid][key] = 0.0f;
        rescale[tid] = 1.0f;
      } else {
        const float new_max = fmaxf(run_max[tid], tile_max);
        float sum = 0.0f;
        for (int key = 0; key < kKeyTile; ++key) {
          const float w = expf(weights[tid][key] - new_max);  // 0 for keys past the run
          weights[tid][key] = w;
          sum += w;
        }
        rescale[tid] = expf(run_max[tid] - new_max);  // 0 while nothing was seen
        run_sum[tid] = run_sum[tid] * rescale[tid] + sum;
        run_max[tid] = new_max;
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHeadsPerBlock; ++h) {
#pragma unroll
      for (int i = 0; i < kColsPerThread; ++i) acc[h][i] *= rescale[h];
    }
    for (int key = 0; key < keys; ++key) {
#pragma unroll
      for (int i = 0; i < kColsPerThread; ++i) {
        const int col = tid + i * kThreads;
        const float value = col < c ? Bf16ToFloat(tile[key][col]) : 0.0f;
#pragma unroll
        for (int h = 0; h < kHeadsPerBlock; ++h) acc[h][i] += weights[h][key] * value;
      }
    }
    __syncthreads();  // the next tile overwrites tile and weights
  }

  const int splits = gridDim.x;
#pragma unroll
  for (int h = 0; h < kHeadsPerBlock; ++h) {
    if (head0 + h >= p.heads) break;
    float* part = p.workspace +
                  ((static_cast<int64_t>(b) * splits + split) * p.heads + head0 + h) * (c + 2);
#pragma unroll
    for (int i = 0; i < kColsPerThread; ++i) {
      const int col = tid + i * kThreads;
      if (col < c) part[col] = acc[h][i];
    }
    if (tid == 0) {
      part[c] = run_max[h];
      part[c + 1] = run_sum[h];
    }
  }
}

__global__ void __launch_bounds__(kThreads) MlaDecodeCombineKernel(const MlaDecodeLaunch p,
                                                                    int splits) {
  const int head = blockIdx.x, b = blockIdx.y, c = p.kv_lora_rank;
  const int length = p.lengths[b];
  const int used = (length + p.keys_per_split - 1) / p.keys_per_split;
  const float* first = p.workspace + (static_cast<int64_t>(b) * splits * p.heads + head) * (c + 2);
  const int64_t split_stride = static_cast<int64_t>(p.heads) * (c + 2);
  float best = -INFINITY;
  for (int s = 0; s < used; ++s) best = fmaxf(best, first[s * split_stride + c]);
  float total = 0.0f;
  for (int s = 0; s < used; ++s) {
    total += expf(first[s * split_stride + c] - best) * first[s * split_stride + c + 1];
  }
  float* out = p.out + (static_cast<int64_t>(b) * p.heads + head) * c;
  for (int col = threadIdx.x; col < c; col += kThreads) {
    float sum = 0.0f;
    for (int s = 0; s < used; ++s) {
      sum += expf(first[s * split_stride + c] - best) * first[s * split_stride + col];
    }
    out[col] = used > 0 ? sum / total : 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------
// The tensor-core split kernel. Block (split, group of 16 heads, sequence), 4 warps; the cache is
// read 16 keys at a time as in the fp32 kernel, and both products are mma.sync.m16n8k16 (bf16 in,
// fp32 accumulate) with the heads as the MMA's 16 rows:
//   scores S [16 heads, 16 keys] = Q [16, width] · K [16 keys, width]ᵀ: warp w takes its quarter
//     of the width (k-steps w, w + 4, ...) for both 8-key halves; the four partial S meet in
//     shared memory;
//   softmax: thread t updates head t / 8 over keys 2 (t % 8), 2 (t % 8) + 1, the 8 threads of a
//     head reducing by shuffles; weights e^{s − max} go to shared memory as bf16;
//   values O [16 heads, c] += P [16, 16 keys] · V [16 keys, c]: warp w owns columns
//     [w c / 4, (w + 1) c / 4) as 8-column MMA tiles (c / 32 of them, 16 at K3: 64 fp32
//     accumulators per lane), rescaled when a head's max grows.
// The query and the weights are rounded to bf16 (as FlashMLA does); sums stay fp32.
// Fragments (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t; A regs {row g, k 2t..2t+1},
// {g + 8, 2t}, {g, 2t + 8}, {g + 8, 2t + 8}; B regs {k 2t..2t+1, n g}, {k 2t + 8.., n g};
// C {row g, n 2t, 2t + 1}, {row g + 8, n 2t, 2t + 1}; the lower k in the lower 16 bits.

constexpr int kMmaHeads = 16;
constexpr int kMmaWarps = 4;
// Row stride of Q and K in shared memory: 584 bf16 = 292 words (1168 bytes, a multiple of 16 for
// the 16-byte stores), 4 banks apart per row, so the 8 rows and 4 word columns one fragment load
// touches hit 32 different banks.
constexpr int kMmaStride = kMlaDecodeMaxWidth + 8;
constexpr int kMmaWeightStride = kKeyTile + 8;  // bf16 weights [16 heads][16 keys], 12 words apart

__device__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // .x = lo in the lower 16 bits
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ uint32_t Word(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__global__ void __launch_bounds__(kThreads) MlaDecodeMmaKernel(const MlaDecodeLaunch p) {
  static_assert(kThreads == kMmaWarps * 32, "4 warps");
  constexpr int kMaxTiles = kMlaDecodeMaxRank / (8 * kMmaWarps);  // value tiles per warp
  const int split = blockIdx.x, head0 = blockIdx.y * kMmaHeads, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int c = p.kv_lora_rank, width = c + p.rope_dim, tiles = c / (8 * kMmaWarps);
  const int length = p.lengths[b];
  const int k_begin = split * p.keys_per_split;
  const int k_end = min(length, k_begin + p.keys_per_split);

  __shared__ __align__(16) uint16_t query[kMmaHeads][kMmaStride];
  __shared__ __align__(16) uint16_t keys_tile[kKeyTile][kMmaStride];
  __shared__ float partial_scores[kMmaWarps][kMmaHeads][kKeyTile];
  __shared__ __align__(16) uint16_t weights[kMmaHeads][kMmaWeightStride];
  __shared__ float rescale[kMmaHeads], run_max[kMmaHeads], run_sum[kMmaHeads];

  for (int i = tid; i < kMmaHeads * (width / 2); i += kThreads) {
    const int h = i / (width / 2), d = 2 * (i % (width / 2));
    float lo = 0.0f, hi = 0.0f;
    if (head0 + h < p.heads) {
      const float* q = p.q + (static_cast<int64_t>(b) * p.heads + head0 + h) * width + d;
      lo = q[0];
      hi = q[1];
    }
    *reinterpret_cast<uint32_t*>(&query[h][d]) = PackBf16(lo, hi);
  }
  if (tid < kMmaHeads) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  float acc[kMaxTiles][4] = {};
  const int pieces = width / 8;  // 16-byte pieces of a row (width is a multiple of 16)
  __syncthreads();

  for (int k0 = k_begin; k0 < k_end; k0 += kKeyTile) {
    const int keys = min(kKeyTile, k_end - k0);
    // The tile's rows, 16 bytes per load (rows past the run: zeros, so their products are 0).
    for (int i = tid; i < kKeyTile * pieces; i += kThreads) {
      const int key = i / pieces, w = i % pieces, n = k0 + key;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (key < keys) {
        const int64_t page = p.block_table[static_cast<int64_t>(b) * p.max_pages + n / p.page_size];
        value = reinterpret_cast<const uint4*>(
            p.cache + (page * p.page_size + n % p.page_size) * width)[w];
      }
      reinterpret_cast<uint4*>(keys_tile[key])[w] = value;
    }
    __syncthreads();
    {  // this warp's share of the scores: k-steps warp, warp + 4, ...
      float s[2][4] = {};
      for (int k = warp * 16; k < width; k += 16 * kMmaWarps) {
        const uint32_t a0 = Word(&query[g][k + 2 * t]), a1 = Word(&query[g + 8][k + 2 * t]);
        const uint32_t a2 = Word(&query[g][k + 2 * t + 8]), a3 = Word(&query[g + 8][k + 2 * t + 8]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint16_t* key_row = keys_tile[8 * half + g];
          Mma(s[half], a0, a1, a2, a3, Word(key_row + k + 2 * t), Word(key_row + k + 2 * t + 8));
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 8 * half + 2 * t;
        partial_scores[warp][g][n] = s[half][0];
        partial_scores[warp][g][n + 1] = s[half][1];
        partial_scores[warp][g + 8][n] = s[half][2];
        partial_scores[warp][g + 8][n + 1] = s[half][3];
      }
    }
    __syncthreads();
    {  // the running softmax: head tid / 8, keys 2 (tid % 8) and 2 (tid % 8) + 1
      const int h = tid / 8, n = 2 * (tid % 8);
      float s0 = -INFINITY, s1 = -INFINITY;
      if (n < keys) s0 = 0.0f;
      if (n + 1 < keys) s1 = 0.0f;
      for (int w = 0; w < kMmaWarps; ++w) {
        if (n < keys) s0 += partial_scores[w][h][n];
        if (n + 1 < keys) s1 += partial_scores[w][h][n + 1];
      }
      float tile_max = fmaxf(s0, s1);
      for (int offset = 1; offset < 8; offset <<= 1) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      }
      const float old_max = run_max[h], new_max = fmaxf(old_max, tile_max);
      const float w0 = expf(s0 - new_max), w1 = expf(s1 - new_max);  // 0 past the run
      float sum = w0 + w1;
      for (int offset = 1; offset < 8; offset <<= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      *reinterpret_cast<uint32_t*>(&weights[h][n]) = PackBf16(w0, w1);
      __syncwarp();
      if (tid % 8 == 0) {
        const float factor = expf(old_max - new_max);  // 0 while nothing was seen
        rescale[h] = factor;
        run_sum[h] = run_sum[h] * factor + sum;
        run_max[h] = new_max;
      }
    }
    __syncthreads();
    {  // O += P · V over this warp's column tiles
      const uint32_t a0 = Word(&weights[g][2 * t]), a1 = Word(&weights[g + 8][2 * t]);
      const uint32_t a2 = Word(&weights[g][2 * t + 8]), a3 = Word(&weights[g + 8][2 * t + 8]);
      const float low = rescale[g], high = rescale[g + 8];
#pragma unroll
      for (int i = 0; i < kMaxTiles; ++i) {
        if (i >= tiles) break;
        const int col = (warp * tiles + i) * 8 + g;
        const uint32_t b0 = keys_tile[2 * t][col] | (uint32_t{keys_tile[2 * t + 1][col]} << 16);
        const uint32_t b1 =
            keys_tile[2 * t + 8][col] | (uint32_t{keys_tile[2 * t + 9][col]} << 16);
        acc[i][0] *= low;
        acc[i][1] *= low;
        acc[i][2] *= high;
        acc[i][3] *= high;
        Mma(acc[i], a0, a1, a2, a3, b0, b1);
      }
    }
    __syncthreads();  // the next tile overwrites keys_tile and weights
  }

  const int splits = gridDim.x;
  auto part = [&](int h) {
    return p.workspace + ((static_cast<int64_t>(b) * splits + split) * p.heads + head0 + h) * (c + 2);
  };
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) {
    if (i >= tiles) break;
    const int col = (warp * tiles + i) * 8 + 2 * t;
    if (head0 + g < p.heads) {
      part(g)[col] = acc[i][0];
      part(g)[col + 1] = acc[i][1];
    }
    if (head0 + g + 8 < p.heads) {
      part(g + 8)[col] = acc[i][2];
      part(g + 8)[col + 1] = acc[i][3];
    }
  }
  if (tid < kMmaHeads && head0 + tid < p.heads) {
    part(tid)[c] = run_max[tid];
    part(tid)[c + 1] = run_sum[tid];
  }
}

}  // namespace

int32_t MlaKeysPerSplit(int32_t batch, int32_t heads, int32_t max_length) {
  // Four 8-head blocks per SM of an H200 (two of the tensor-core kernel's 16-head blocks).
  constexpr int64_t kTargetBlocks = 4 * 132;
  const int64_t groups = static_cast<int64_t>(batch) * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  const int64_t splits = std::max<int64_t>(1, (kTargetBlocks + groups - 1) / std::max<int64_t>(groups, 1));
  int64_t keys = (std::max(max_length, 1) + splits - 1) / splits;
  keys = (keys + kKeyTile - 1) / kKeyTile * kKeyTile;
  return static_cast<int32_t>(std::max<int64_t>(keys, 64));
}

size_t MlaDecodeWorkspaceFloats(const MlaDecodeLaunch& p) {
  if (p.keys_per_split <= 0 || p.max_length < 0) return 0;
  return static_cast<size_t>(p.batch) * Splits(p) * p.heads * (p.kv_lora_rank + 2);
}

namespace {

bool Handles(const MlaDecodeLaunch& p, int heads_per_block) {
  const int width = p.kv_lora_rank + p.rope_dim;
  return p.batch >= 1 && p.batch <= 65535 && p.heads >= 1 && p.kv_lora_rank >= 2 &&
         p.kv_lora_rank <= kMlaDecodeMaxRank && p.rope_dim >= 0 && width <= kMlaDecodeMaxWidth &&
         width % 2 == 0 && p.page_size >= 1 && p.max_pages >= 1 && p.max_length >= 1 &&
         p.keys_per_split >= kKeyTile && p.keys_per_split % kKeyTile == 0 &&
         (p.heads + heads_per_block - 1) / heads_per_block <= 65535;
}

int Launch(const MlaDecodeLaunch& p, cudaStream_t s, bool tensor_cores) {
  const int splits = Splits(p);
  const int per_block = tensor_cores ? kMmaHeads : kHeadsPerBlock;
  const dim3 grid(splits, (p.heads + per_block - 1) / per_block, p.batch);
  if (tensor_cores) {
    MlaDecodeMmaKernel<<<grid, kThreads, 0, s>>>(p);
  } else {
    MlaDecodeSplitKernel<<<grid, kThreads, 0, s>>>(p);
  }
  const cudaError_t split_error = cudaGetLastError();
  if (split_error != cudaSuccess) return static_cast<int>(split_error);
  MlaDecodeCombineKernel<<<dim3(p.heads, p.batch), kThreads, 0, s>>>(p, splits);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchMlaDecode(const MlaDecodeLaunch& p, void* stream) {
  if (!Handles(p, kHeadsPerBlock)) return static_cast<int>(cudaErrorInvalidValue);
  return Launch(p, static_cast<cudaStream_t>(stream), false);
}

int LaunchMlaDecodeTensorCores(const MlaDecodeLaunch& p, void* stream) {
  const int width = p.kv_lora_rank + p.rope_dim;
  if (!Handles(p, kMmaHeads) || p.kv_lora_rank % (8 * kMmaWarps) != 0 || width % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return Launch(p, static_cast<cudaStream_t>(stream), true);
}

}  // namespace k3
