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
// FLOPs per byte of cache) it is bound by the CUDA cores, not by the memory; the tensor-core form
// (mma.sync over [heads, keys] tiles) is the next step, and this kernel is the reference for it.
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

}  // namespace

int32_t MlaKeysPerSplit(int32_t batch, int32_t heads, int32_t max_length) {
  constexpr int64_t kTargetBlocks = 2 * 132;  // two per SM of an H200
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

int LaunchMlaDecode(const MlaDecodeLaunch& p, void* stream) {
  const int width = p.kv_lora_rank + p.rope_dim;
  if (p.batch < 1 || p.batch > 65535 || p.heads < 1 || p.kv_lora_rank < 2 ||
      p.kv_lora_rank > kMlaDecodeMaxRank || p.rope_dim < 0 || width > kMlaDecodeMaxWidth ||
      width % 2 != 0 || p.page_size < 1 || p.max_pages < 1 || p.max_length < 1 ||
      p.keys_per_split < kKeyTile || p.keys_per_split % kKeyTile != 0 ||
      (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock > 65535) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int splits = Splits(p);
  const dim3 grid(splits, (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.batch);
  MlaDecodeSplitKernel<<<grid, kThreads, 0, s>>>(p);
  const cudaError_t split_error = cudaGetLastError();
  if (split_error != cudaSuccess) return static_cast<int>(split_error);
  MlaDecodeCombineKernel<<<dim3(p.heads, p.batch), kThreads, 0, s>>>(p, splits);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
