#include "attention_nodes/cuda/kda_prefill.h"

#include <cuda_runtime.h>

namespace k3 {

int LaunchKdaPrefill(const KdaDecodeLaunch& chunk, int32_t tokens, void* stream) {
  if (tokens < 1 || chunk.batch != 1 || chunk.heads < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t width = static_cast<int64_t>(chunk.heads) * chunk.head_dim;
  for (int32_t t = 0; t < tokens; ++t) {
    KdaDecodeLaunch step = chunk;
    step.q = chunk.q + t * width;
    step.k = chunk.k + t * width;
    step.v = chunk.v + t * width;
    step.decay = chunk.decay + t * width;
    step.gate = chunk.gate + t * width;
    step.out = chunk.out + t * width;
    step.beta_logit = chunk.beta_logit + static_cast<int64_t>(t) * chunk.heads;
    // The first launch also checks the shape, before anything is enqueued.
    if (const int error = LaunchKdaDecode(step, stream); error != 0) return error;
  }
  return 0;
}

}  // namespace k3
