// The MoE gate (moe_gate.h): the launch and its shape checks; the device code is
// moe_gate_kernel.inc.
#include "kernels/cuda/moe_gate.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/moe_gate_kernel.inc"

namespace k3 {

int LaunchMoeGate(const MoeGateArgs& args, void* stream) {
  if (args.tokens < 1 || args.num_experts < 1 || args.num_experts > kMoeGateMaxExperts ||
      args.top_k < 1 || args.top_k > args.num_experts || args.top_k > kMoeGateMaxTopK ||
      args.logits_stride < args.num_experts) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  MoeGateKernel<<<args.tokens, kMoeGateThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace k3
