// KDA prefill on a GPU, in its per-chunk recurrent form (spec §5, the twin of
// attention_nodes/forward/kda.cc's chunked prefill): one sequence's chunk of T new tokens runs in
// one launch of kda_decode.h's fused kernel (KdaDecodeLaunch::tokens = T), the tokens one after
// another with the state held in registers, so the state is read and written once per chunk and the
// conv caches advance token by token exactly as in decode. The tokens of a chunk are still
// sequential within a block (the chunked WY form, which turns a chunk into matrix products on the
// tensor cores, is the next version).
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_KDA_PREFILL_H_
#define K3SERVE_ATTENTION_NODES_CUDA_KDA_PREFILL_H_

#include <cstdint>

#include "attention_nodes/cuda/kda_decode.h"

namespace k3 {

// `chunk` as a KdaDecodeLaunch for one sequence (batch 1, slots[0] its slot) whose per-token
// arrays hold `tokens` rows each, in order: q, k, v, decay, gate and out [tokens, P], beta_logit
// [tokens, H]. Enqueues one launch on `stream` (a cudaStream_t; nullptr for the legacy stream)
// and returns its cudaError_t (0: enqueued); tokens < 1, a batch other than 1, chunk.tokens other
// than 1 or a shape LaunchKdaDecode refuses returns cudaErrorInvalidValue (1) with nothing
// enqueued.
int LaunchKdaPrefill(const KdaDecodeLaunch& chunk, int32_t tokens, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_KDA_PREFILL_H_
