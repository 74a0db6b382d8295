// fp32 to bf16 bits on the device, rounded to nearest even (as kernels/bf16.h's FloatToBf16), for
// the .inc kernels that store bf16. Included by .cu files only; kernels/cuda/simt_emulation.h
// defines the same function for those kernels' CPU emulation tests.
#ifndef K3SERVE_KERNELS_CUDA_DEVICE_BF16_CUH_
#define K3SERVE_KERNELS_CUDA_DEVICE_BF16_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace k3 {

__device__ inline uint16_t DeviceFloatToBf16Bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_DEVICE_BF16_CUH_
