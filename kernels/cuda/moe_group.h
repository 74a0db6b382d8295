// Grouping an MoE layer's routing by expert on the device, so that a step whose router runs on the
// GPU (kernels/cuda/moe_gate.h) feeds the expert launches (kernels/cuda/moe_mxfp4.h) without the
// host: from the gate's ids and weights [rows, top_k], the slots (row, weight) in the order
// GroupSlotsByExpert (kernels/cuda/moe_grouping.h) gives them for the same assignments in (row,
// slot) order, the chunks of at most chunk_tokens slots of one expert, each row's slots (the
// combine's order), and the slots' rows as bf16.
//
// Sizes stay known on the host: the slots are rows x top_k (every row picks top_k experts), and
// the chunks at most MoeGroupMaxChunks; the chunks past the ones used are written empty (tokens
// 0), which the expert launches skip. So a step can be captured in a CUDA graph.
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_KERNELS_CUDA_MOE_GROUP_H_
#define K3SERVE_KERNELS_CUDA_MOE_GROUP_H_

#include <cstdint>

#include "kernels/cuda/moe_mxfp4.h"

namespace k3 {

inline constexpr int kMoeGroupMaxExperts = 1024;

struct MoeGroupArgs {
  // [rows, top_k] global expert ids. Ids outside [0, num_experts) (none from the gate) are
  // dropped: their slots come last, weight 0, in no chunk.
  const int32_t* ids = nullptr;
  const float* weights = nullptr;  // [rows, top_k]
  int32_t rows = 0;
  int32_t top_k = 0;
  const int32_t* table_index = nullptr;  // [num_experts]: the kernels' expert index, -1: dropped
  int32_t num_experts = 0;
  int32_t chunk_tokens = 8;      // 8, 16 or 32
  int32_t max_chunks = 0;        // chunks has this many entries; MoeGroupMaxChunks or more
  int32_t* slot_row = nullptr;   // out [rows * top_k]
  float* slot_weight = nullptr;  // out [rows * top_k]
  // out [rows * top_k]: assignment i's slot, or -1 where it is in no chunk (an id out of range, an
  // expert with table_index -1): MoeMxfp4Launch::row_slots with per_row = top_k.
  int32_t* row_slots = nullptr;
  MoeChunk* chunks = nullptr;    // out [max_chunks]
};

// Enough chunks for any routing of `rows` rows of top_k distinct experts among `experts`: one
// partial chunk per used expert plus the full ones.
inline int32_t MoeGroupMaxChunks(int32_t rows, int32_t top_k, int32_t experts,
                                 int32_t chunk_tokens) {
  const int32_t slots = rows * top_k;
  return (experts < slots ? experts : slots) + slots / chunk_tokens;
}

// One block; returns its cudaError_t (0: enqueued). cudaErrorInvalidValue (1) with nothing
// enqueued for rows or top_k below 1, num_experts outside [1, kMoeGroupMaxExperts], a chunk size
// other than 8/16/32, or max_chunks below MoeGroupMaxChunks.
int LaunchMoeGroup(const MoeGroupArgs& args, void* stream);

// x[s, :] = bf16(z[slot_row[s], :]) for s < slots (round to nearest even, as kernels/bf16.h),
// z [*, width] fp32. Returns the cudaError_t; cudaErrorInvalidValue for slots or width below 1.
int LaunchMoeGatherRows(const float* z, int32_t width, const int32_t* slot_row, int32_t slots,
                        uint16_t* x, void* stream);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_MOE_GROUP_H_
