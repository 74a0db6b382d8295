// MLA decode on a GPU in the absorbed form (spec §6.2, the absorbed path of
// attention_nodes/forward/mla.cc): for each sequence of a batch, one query token whose heads have
// already been absorbed (q̃_h = [W_K[h]ᵀ q_nope_h, q_pe_h], pre-scaled by 1/sqrt(q_head_dim))
// attends to every row of its latent cache, [c (kv_lora_rank) | k_pe (rope_dim)] per token; the
// output per head is the softmax-weighted sum of the rows' c parts, for W_V[h] to expand
// afterwards. The projections on either side are plain GEMMs, not part of this file.
//
// The cache is bf16 in pages of `page_size` tokens: pages [pages, page_size, c + r] in one pool,
// and a block table [batch, max_pages] listing each sequence's pages in order (token n of sequence
// b is row n % page_size of page block_table[b, n / page_size]).
//
// Two launches on one stream ("split-KV", flash-decoding): each sequence's keys are cut into runs
// of keys_per_split; one block computes a run's softmax partial (its max, sum and weighted row sum)
// for 8 heads (fp32 CUDA cores) or 16 (tensor cores), then a combine launch merges the runs of
// each (sequence, head).
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_MLA_DECODE_H_
#define K3SERVE_ATTENTION_NODES_CUDA_MLA_DECODE_H_

#include <cstddef>
#include <cstdint>

namespace k3 {

// The widest latent and cache row the kernel holds in shared memory and registers (K3: 512 + 64).
inline constexpr int kMlaDecodeMaxRank = 512;
inline constexpr int kMlaDecodeMaxWidth = kMlaDecodeMaxRank + 64;
// keys_per_split must be a multiple of this (the keys a block reads at a time).
inline constexpr int kMlaDecodeKeyTile = 16;

struct MlaDecodeLaunch {
  int32_t batch = 0;         // sequences, one query token each
  int32_t heads = 0;         // H
  int32_t kv_lora_rank = 0;  // c: 2..512, even
  int32_t rope_dim = 0;      // r: c + r <= 576, even
  int32_t page_size = 64;    // tokens per page
  int32_t max_pages = 0;     // the block table's row length
  int32_t max_length = 0;    // >= every lengths[b] (sizes the grid and the workspace)
  int32_t keys_per_split = 0;         // a multiple of kMlaDecodeKeyTile; MlaKeysPerSplit picks one
  const int32_t* lengths = nullptr;   // [batch]: cached tokens of each sequence (its own included)
  const int32_t* block_table = nullptr;  // [batch, max_pages]
  const uint16_t* cache = nullptr;       // bf16 [pages, page_size, c + r]
  const float* q = nullptr;              // [batch, H, c + r], absorbed and pre-scaled
  float* workspace = nullptr;            // MlaDecodeWorkspaceFloats(launch) floats
  float* out = nullptr;                  // [batch, H, c]; a sequence with length 0 gets zeros
};

// A split size that gives about four 8-head blocks per SM of an H200 for this batch (at least 64
// keys per split).
int32_t MlaKeysPerSplit(int32_t batch, int32_t heads, int32_t max_length);

// Floats of workspace the launch needs: batch x splits x H x (c + 2).
size_t MlaDecodeWorkspaceFloats(const MlaDecodeLaunch& launch);

// Enqueues both launches on `stream` (a cudaStream_t; nullptr for the legacy stream). Returns the
// cudaError_t of the launches (0: enqueued); a shape it does not handle returns
// cudaErrorInvalidValue (1) with nothing enqueued.
int LaunchMlaDecode(const MlaDecodeLaunch& launch, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_MLA_DECODE_H_
