// Launches the fused KDA decode step (kda_decode.h); the kernel is kda_decode_kernel.inc.
#include "attention_nodes/cuda/kda_decode.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_nodes/cuda/kda_decode_kernel.inc"

namespace k3 {
namespace {

using kda_kernel::kMaxConvKernel;
using kda_kernel::kRowsPerThread;

template <int kDim>
int Launch(const KdaDecodeLaunch& p, cudaStream_t stream) {
  const dim3 grid(p.heads, p.batch);
  constexpr int kThreads = kDim * (kDim / kRowsPerThread);
  if (p.tokens == 1) {
    kda_kernel::KdaDecodeKernel<kDim><<<grid, kThreads, 0, stream>>>(p);
  } else {
    kda_kernel::KdaChunkKernel<kDim><<<grid, kThreads, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchKdaDecode(const KdaDecodeLaunch& p, void* stream) {
  if (p.batch < 1 || p.batch > 65535 || p.tokens < 1 ||
      int64_t{p.batch} * p.tokens > INT32_MAX || p.heads < 1 || p.conv_kernel < 1 ||
      p.conv_kernel > kMaxConvKernel) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.head_dim) {
    case 32:
      return Launch<32>(p, s);
    case 64:
      return Launch<64>(p, s);
    case 128:
      return Launch<128>(p, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace k3
