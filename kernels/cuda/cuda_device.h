// Which CUDA devices this process can use, for the commands' `--device cuda:N`: one check and one
// message for every GPU component (the expert kernels, the GPU engine, the attention worker's
// runner). Plain C++ (no CUDA headers).
#ifndef K3SERVE_KERNELS_CUDA_CUDA_DEVICE_H_
#define K3SERVE_KERNELS_CUDA_CUDA_DEVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {

// The number of CUDA devices, or Unavailable with the runtime's reason (no driver, no GPU).
absl::StatusOr<int> CudaDeviceCount();

// OK when device `device` exists; else Unavailable naming it and the device count (or why there
// is none).
absl::Status CheckCudaDevice(int device);

// CheckCudaDevice, then makes `device` current on the calling thread (Unavailable if it cannot).
absl::Status UseCudaDevice(int device);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_CUDA_DEVICE_H_
