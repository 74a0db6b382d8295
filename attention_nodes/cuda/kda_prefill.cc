#include "attention_nodes/cuda/kda_prefill.h"

#include <cuda_runtime.h>

namespace k3 {

int LaunchKdaPrefill(const KdaDecodeLaunch& chunk, int32_t tokens, void* stream) {
  if (tokens < 1 || chunk.batch != 1 || chunk.tokens != 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  KdaDecodeLaunch launch = chunk;
  launch.tokens = tokens;
  return LaunchKdaDecode(launch, stream);
}

}  // namespace k3
