// The routed experts of one MoE layer on a GPU, MXFP4 weights x bf16 activations (spec §7.2):
//   out[row] += Σ_{(row, e, w)} w · W2_e (act(W1_e x) ⊙ cap(W3_e x))
// as two launches on one stream, each covering every expert of the call:
//   1. gate/up: h[slot] = GLU(W1_e x[slot], W3_e x[slot]), bf16, the activation fused;
//   2. down: slot_out[slot] = weight(slot) · W2_e h[slot], fp32, the routing weight fused;
//   3. combine: out[row] = Σ slot_out over the row's slots, in the order row_slots gives them (a
//      fixed order: the same call gives the same bits, in a CUDA graph or not).
// Weights stay packed in device memory (kernels/cuda/mxfp4_gpu_layout.h) and are widened to bf16
// in registers; tensor-core MMAs (mma.sync m16n8k16, fp32 accumulate) take the weights as the
// 16-row side and up to 8 tokens per MMA as the narrow side ("swap AB"), so 1..16 tokens per
// expert cost the weight bytes once. Each warp owns 16 output rows of one expert over the whole
// input width, so a row's sum is in one warp's registers and the epilogue needs no reduction.
//
// The slots are the call's (row, expert) pairs grouped by expert; a chunk is up to
// `chunk_tokens` consecutive slots of one expert (an expert with more slots has several chunks,
// which read its weights again: prefill-sized work is correct here, not fast).
//
// This header is plain C++ (no CUDA headers), so C++ callers (kernels/cuda/gpu_experts.h) include
// it. All pointers are device pointers; nothing is owned.
#ifndef K3SERVE_KERNELS_CUDA_MOE_MXFP4_H_
#define K3SERVE_KERNELS_CUDA_MOE_MXFP4_H_

#include <cstdint>

#include "kernels/cuda/mxfp4_gpu_layout.h"

namespace k3 {

// One matrix in the GPU layout: its codes and its scales.
struct Mxfp4DeviceMatrix {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
};

// One expert's three matrices: gate and up [hidden, width], down [width, hidden].
struct Mxfp4DeviceExpert {
  Mxfp4DeviceMatrix gate, up, down;
};

struct MoeChunk {
  int32_t expert = 0;      // index into MoeMxfp4Launch::experts
  int32_t first_slot = 0;  // the chunk's slots are [first_slot, first_slot + tokens)
  int32_t tokens = 0;      // 1..chunk_tokens; 0: an empty chunk, skipped
};

struct MoeMxfp4Launch {
  const Mxfp4DeviceExpert* experts = nullptr;  // device array
  const MoeChunk* chunks = nullptr;            // device array of chunk_count
  int32_t chunk_count = 0;
  int32_t chunk_tokens = 8;  // 8, 16 or 32: the largest MoeChunk::tokens allowed
  int32_t width = 0;         // d: gate/up inputs, down outputs; a multiple of 64
  int32_t hidden = 0;        // f: gate/up outputs, down inputs; a multiple of 64
  const uint16_t* x = nullptr;          // bf16 [slots, width]
  uint16_t* h = nullptr;                // bf16 [slots, hidden], scratch written by launch 1
  const float* slot_weight = nullptr;   // [slots]: its routing weight
  float* slot_out = nullptr;            // fp32 [slots, width], scratch written by launch 2
  // [rows, per_row]: each output row's slots, summed in this order; -1 entries are skipped (a
  // row with fewer slots, an assignment dropped from the chunks).
  const int32_t* row_slots = nullptr;
  int32_t rows = 0;                     // 0: no launch 3, nothing written to out
  int32_t per_row = 0;
  float* out = nullptr;                 // fp32 [rows, width]; overwritten (launch 3)
  GpuGluParams glu;
};

// Enqueues the three launches on `stream` (a cudaStream_t; nullptr for the legacy stream); with
// no chunks, only the combine (out all zeros). Returns the cudaError_t of the launches (0:
// enqueued). A bad shape (width or hidden not a multiple of 64, chunk_tokens not 8, 16 or 32,
// negative rows or per_row) returns cudaErrorInvalidValue before anything is enqueued.
int LaunchMoeMxfp4(const MoeMxfp4Launch& launch, void* stream);

// For tests: out[4i + p] = fragment register p as the kernels widen codes word words[i] (bf16x2:
// the values of the codes whose bits Mxfp4CodeBits(p, 0 or 1, code) places), for i < n. Device pointers;
// returns the launch's cudaError_t.
int LaunchMxfp4DequantProbe(const uint32_t* words, uint32_t* out, int n, void* stream);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_MOE_MXFP4_H_
