// The bytes a decode step must move at least, for the GPU step benchmark's bandwidth floor (issue
// 21): the step time no kernel can beat is these bytes over the device's copy rate.
//
// Counted per step of `batch` sequences, one new token each:
//  - weights: every non-routed-expert matrix and vector once, at 2 bytes a value (the BF16
//    weights the GPU keeps; the few fp32 vectors are counted at 2 bytes too, under 0.01%), minus
//    the embedding table, of which a token reads one row (counted per token);
//  - experts: the packed MXFP4 bytes (codes and E8M0 scales) of each distinct routed expert the
//    step touches, summed over the MoE layers (the caller counts them from the routing);
//  - KDA state: each sequence's fp32 recurrent state [H, K, K] and short-conv caches
//    (3 x [kernel - 1, H K]) of every KDA layer, read and written once;
//  - MLA cache: each sequence's bf16 latent rows (kv_lora_rank + rope dims per token) of every
//    MLA layer, read once over the whole context (the new token's row included).
// Activations are left out (a few MB at batch 32 against gigabytes of weights).
//
// Pure host arithmetic on the config; thread-safe.
#ifndef K3SERVE_BENCH_STEP_BYTES_H_
#define K3SERVE_BENCH_STEP_BYTES_H_

#include <cstdint>

#include "model/config.h"

namespace k3 {

struct DecodeStepBytes {
  double weights = 0, experts = 0;      // the model's share: once per step
  double kda_state = 0, mla_cache = 0;  // the sequences' share: grows with the batch

  double total() const { return weights + experts + kda_state + mla_cache; }
};

// Parameters of every tensor but the routed experts, the embedding table included (spec §12.7's
// "~3.3B BF16 non-expert params" for k3-slice).
int64_t NonExpertParameters(const ModelConfig& config);

// Bytes of one routed expert's three matrices in MXFP4: half a byte per value plus one E8M0
// scale byte per 32 values.
int64_t Mxfp4ExpertBytes(const ModelConfig& config);

// The bytes of one decode step: `batch` sequences whose length after the step is `context`
// tokens each, `experts_touched` distinct (layer, expert) pairs over all MoE layers.
DecodeStepBytes DecodeStepBytesFor(const ModelConfig& config, int batch, double context,
                                   double experts_touched);

}  // namespace k3

#endif  // K3SERVE_BENCH_STEP_BYTES_H_
