// Test-only helpers for the GPU kernels' tests: whether a GPU is there, and device
// arrays that upload from and download to std::vector (every CUDA error fails the test).
#ifndef K3SERVE_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define K3SERVE_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace k3::gpu_test {

// True when the CUDA runtime sees a device; otherwise prints "skipped: no GPU (reason)" (the line
// tools/gpu_check.sh and tools/test.sh look for) and returns false.
inline bool HaveGpu() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) return true;
  std::printf("skipped: no GPU (%s)\n",
              error != cudaSuccess ? cudaGetErrorString(error) : "the CUDA runtime sees no device");
  return false;
}

// A device copy of a vector; owns its memory.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // `size` elements, every byte 0xff (a NaN as float: a result never written shows).
  explicit DeviceArray(size_t size) : size_(size) {
    EXPECT_EQ(cudaMalloc(&data_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0xff, Bytes()), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  std::vector<T> Download() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t Bytes() const { return size_ * sizeof(T); }
  size_t size_;
  T* data_ = nullptr;
};

// Waits for the device and expects no error from the launches before.
inline void ExpectDeviceOk() {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace k3::gpu_test

#endif  // K3SERVE_KERNELS_CUDA_GPU_TEST_UTIL_H_
