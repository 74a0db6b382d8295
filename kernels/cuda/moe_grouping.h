// The slots of an MoE expert call: a call's (row, expert) assignments grouped by expert, in the
// order RunExperts computes them (by expert id, stable: within an expert in assignment order), and
// cut into chunks of at most chunk_tokens consecutive slots of one expert, as
// kernels/cuda/moe_mxfp4.h's launches take them. The host side of GpuExpertCompute::Run, and the
// reference the device grouping (kernels/cuda/moe_group.h) is tested against.
//
// Pure host code; thread-safe.
#ifndef K3SERVE_KERNELS_CUDA_MOE_GROUPING_H_
#define K3SERVE_KERNELS_CUDA_MOE_GROUPING_H_

#include <cstdint>
#include <vector>

#include "kernels/cuda/moe_mxfp4.h"

namespace k3 {

struct MoeSlots {
  std::vector<int32_t> order;  // slot -> index of its assignment
  std::vector<MoeChunk> chunks;
  int32_t chunk_tokens = 8;
};

// The smallest chunk size the kernels take (8, 16 or 32) that holds `largest` slots (32 above).
int32_t MoeChunkTokensFor(int64_t largest);

// experts[i]: the global expert id of assignment i; table_index: global id -> the kernels'
// expert index (MoeChunk::expert). chunk_tokens: 8, 16 or 32, or 0 to pick MoeChunkTokensFor of
// the largest group. REQUIRES: every experts[i] is in [0, table_index.size()).
MoeSlots GroupSlotsByExpert(const std::vector<int32_t>& experts,
                            const std::vector<int32_t>& table_index, int32_t chunk_tokens);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_MOE_GROUPING_H_
