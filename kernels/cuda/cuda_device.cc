#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no GPU: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("no GPU: the CUDA runtime sees no device");
  return count;
}

absl::Status CheckCudaDevice(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::UnavailableError(
        absl::StrCat("no GPU cuda:", device, ": the CUDA runtime sees ", *count, " device(s)"));
  }
  return absl::OkStatus();
}

absl::Status UseCudaDevice(int device) {
  if (absl::Status s = CheckCudaDevice(device); !s.ok()) return s;
  if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace k3
