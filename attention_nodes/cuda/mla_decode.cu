// Launches the absorbed MLA decode kernels (mla_decode.h); they are in mla_decode_kernels.inc.
#include "attention_nodes/cuda/mla_decode.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "attention_nodes/cuda/mla_decode_kernels.inc"

namespace k3 {
namespace {

using mla_kernels::kHeadsPerBlock;
using mla_kernels::kKeyTile;
using mla_kernels::kThreads;

int32_t Splits(const MlaDecodeLaunch& p) {
  return (p.max_length + p.keys_per_split - 1) / p.keys_per_split;
}

bool Handles(const MlaDecodeLaunch& p) {
  const int width = p.kv_lora_rank + p.rope_dim;
  return p.batch >= 1 && p.batch <= 65535 && p.heads >= 1 && p.kv_lora_rank >= 2 &&
         p.kv_lora_rank <= kMlaDecodeMaxRank && p.rope_dim >= 0 && width <= kMlaDecodeMaxWidth &&
         width % 2 == 0 && p.page_size >= 1 && p.max_pages >= 1 && p.max_length >= 1 &&
         p.keys_per_split >= kKeyTile && p.keys_per_split % kKeyTile == 0 &&
         (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock <= 65535;
}

int Launch(const MlaDecodeLaunch& p, cudaStream_t s) {
  const int splits = Splits(p);
  const dim3 grid(splits, (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.batch);
  mla_kernels::MlaDecodeSplitKernel<<<grid, kThreads, 0, s>>>(p);
  const cudaError_t split_error = cudaGetLastError();
  if (split_error != cudaSuccess) return static_cast<int>(split_error);
  mla_kernels::MlaDecodeCombineKernel<<<dim3(p.heads, p.batch), kThreads, 0, s>>>(p, splits);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int32_t MlaKeysPerSplit(int32_t batch, int32_t heads, int32_t max_length) {
  // Four 8-head blocks per SM of an H200.
  constexpr int64_t kTargetBlocks = 4 * 132;
  const int64_t groups =
      std::max<int64_t>(1, int64_t{batch} * ((heads + kHeadsPerBlock - 1) / kHeadsPerBlock));
  const int64_t splits = std::max<int64_t>(1, (kTargetBlocks + groups - 1) / groups);
  int64_t keys = (std::max(max_length, 1) + splits - 1) / splits;
  keys = (keys + kKeyTile - 1) / kKeyTile * kKeyTile;
  return static_cast<int32_t>(std::max<int64_t>(keys, 64));
}

size_t MlaDecodeWorkspaceFloats(const MlaDecodeLaunch& p) {
  if (p.keys_per_split <= 0 || p.max_length < 0) return 0;
  return static_cast<size_t>(p.batch) * Splits(p) * p.heads * (p.kv_lora_rank + 2);
}

int LaunchMlaDecode(const MlaDecodeLaunch& p, void* stream) {
  if (!Handles(p)) return static_cast<int>(cudaErrorInvalidValue);
  return Launch(p, static_cast<cudaStream_t>(stream));
}

}  // namespace k3
