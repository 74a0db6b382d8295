// DeviceBuffer<T>: an owned array in device memory that grows on demand, for the GPU layers'
// weights, states and scratch. Move-only; not thread-safe.
#ifndef K3SERVE_KERNELS_CUDA_DEVICE_BUFFER_H_
#define K3SERVE_KERNELS_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/matmul.h"
#include "kernels/cuda/cuda_status.h"

namespace k3 {

// Counts reallocations of the GPU layers' device buffers (every DeviceBuffer, the scratch of
// GpuGatedMlp and GpuExpertCompute). A CUDA graph captured before a change may hold freed
// addresses, so GpuModelRunner replays one only while the count is what it was at capture.
inline std::atomic<uint64_t>& DeviceAllocationEpoch() {
  static std::atomic<uint64_t> epoch{0};
  return epoch;
}

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }

  // At least `size` elements; contents are lost when it grows. Growing waits for the whole
  // device first (cudaDeviceSynchronize), so no work queued on any stream, the GPU layers'
  // non-blocking ones included, still uses the old memory when it is freed: cudaFree's own
  // synchronization is not a documented guarantee. Growth is rare (capacities settle after the
  // first steps), so the wait costs nothing in steady state.
  absl::Status Reserve(size_t size) {
    if (size <= size_) return absl::OkStatus();
    DeviceAllocationEpoch().fetch_add(1);
    if (data_ != nullptr) {
      K3_RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize before cudaFree");
    }
    cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
    K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&data_, size * sizeof(T)), "cudaMalloc");
    size_ = size;
    return absl::OkStatus();
  }

  // Exactly the host array's contents (synchronous copy). cudaMemcpy from pageable memory may
  // return before its DMA from the staging buffer has landed (CUDA runtime API, "API
  // synchronization behavior"), and the GPU layers' own streams are non-blocking, so the copy's
  // stream is waited for: work queued after Upload sees the new contents.
  absl::Status Upload(const T* host, size_t size) {
    if (absl::Status s = Reserve(size); !s.ok()) return s;
    if (absl::Status s =
            CudaStatus(cudaMemcpy(data_, host, size * sizeof(T), cudaMemcpyHostToDevice),
                       "cudaMemcpy to the device");
        !s.ok()) {
      return s;
    }
    return CudaStatus(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize(legacy)");
  }
  absl::Status Upload(const std::vector<T>& host) { return Upload(host.data(), host.size()); }

  T* get() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// A BF16 weight matrix's bytes, as stored, into `out` (the GPU layers' products read them so).
// InvalidArgument naming `name` for another type or a missing matrix.
inline absl::Status UploadBf16Matrix(const WeightMatrix& m, const char* name,
                                     DeviceBuffer<uint16_t>* out) {
  if (m.empty() || m.type != WeightType::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a BF16 matrix on the GPU"));
  }
  return out->Upload(static_cast<const uint16_t*>(m.data), static_cast<size_t>(m.rows * m.cols));
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_DEVICE_BUFFER_H_
