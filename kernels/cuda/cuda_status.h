// CUDA runtime and cuBLAS errors as absl::Status, for the host code that drives the GPU kernels.
#ifndef K3SERVE_KERNELS_CUDA_CUDA_STATUS_H_
#define K3SERVE_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace k3 {

// OK for cudaSuccess, else Internal naming `what` and the runtime's description.
inline absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// The launchers of kernels/cuda and attention_nodes/cuda return a cudaError_t as an int.
inline absl::Status CudaStatus(int error, const char* what) {
  return CudaStatus(static_cast<cudaError_t>(error), what);
}

}  // namespace k3

// Returns from the enclosing function (an absl::Status or StatusOr one) when `call`, a CUDA
// runtime call or a kernel launcher, fails.
#define K3_RETURN_IF_CUDA_ERROR(call, what)                                                   \
  do {                                                                                        \
    if (absl::Status k3_cuda_status = ::k3::CudaStatus((call), what); !k3_cuda_status.ok()) { \
      return k3_cuda_status;                                                                  \
    }                                                                                         \
  } while (0)

#endif  // K3SERVE_KERNELS_CUDA_CUDA_STATUS_H_
