// Model weights for GPU benchmarks at real sizes, built in memory in a few seconds (k3-slice:
// 3.3B BF16 values and 6.3B MXFP4 expert values, which a random checkpoint would take minutes to
// draw, quantize and write).
//
// What is cheap here and why it does not change what a GPU step reads: every matrix has its
// config's real shape and dtype, and the GPU code copies each matrix into its own device memory
// (GpuModelRunner per matrix, GpuExpertCompute per expert), so the device holds and reads as many
// bytes as with a real checkpoint. Only the host side is shared:
//  - BF16 matrices view one pool that tiles 4M distinct N(0, 0.02²) values (the embedding table
//    a second pool of N(0, 1) values, spec §12.3's scales), each matrix at its own offset, so
//    matrices differ from one another but repeat every 4M values;
//  - routed experts (MXFP4: uniformly random E2M1 codes, E8M0 scales 2^-8..2^-6, a value std of
//    about 0.02) share one view per MoE layer: every expert of a layer has the same numbers, so
//    GpuExpertCompute repacks them once; the router's gate is random, so routing is not
//    degenerate, and each expert still has its own device copy;
//  - vectors (norms, biases, A_log, conv weights) are drawn in full with spec §12.3's laws.
// The numbers are a pure function of the seed. Not for accuracy tests: use
// model/random_checkpoint.h.
#ifndef K3SERVE_BENCH_SYNTHETIC_WEIGHTS_H_
#define K3SERVE_BENCH_SYNTHETIC_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace k3 {

// Owns the host storage that `weights` views; move-only. Thread-safe to read.
struct SyntheticModel {
  std::unique_ptr<ModelWeights> weights;
  std::vector<uint16_t> linear_pool, embedding_pool;  // bf16
  std::vector<uint8_t> codes_pool, scales_pool;       // MXFP4
};

// Every tensor LoadWeights(WeightSelection::All()) gives for `config`, routed experts MXFP4.
// REQUIRES: a validated config whose expert widths are multiples of 32.
SyntheticModel MakeSyntheticWeights(const ModelConfig& config, uint64_t seed);

}  // namespace k3

#endif  // K3SERVE_BENCH_SYNTHETIC_WEIGHTS_H_
