// MachineLimits: this machine's read bandwidth and compute peaks, measured in the same run as a
// benchmark so that the benchmark can report its speed as a fraction of them (the machine is
// shared and noisy; ratios measured together are what holds).
#ifndef K3SERVE_BENCH_MACHINE_LIMITS_H_
#define K3SERVE_BENCH_MACHINE_LIMITS_H_

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace k3::bench {

struct MachineLimits {
  double read_gbs = 0;     // best of 1 and 4 streams per thread, 2 threads, over 1 GiB
  double fma_gflops = 0;   // fp32 FMA, 2 threads
  double bf16_gflops = 0;  // vdpbf16ps, 2 threads; without it (or with the AVX2 kernels): fp32 FMA
};

// Measures the limits on 2 threads (a few seconds) and prints them: zmm loops where the matrix
// kernels are AVX-512 (ActiveKernelIsa()) and the CPU has avx512_bf16, ymm loops otherwise.
// REQUIRES: AVX2 (HasLimitLoops()).
MachineLimits MeasureMachineLimits();

// The element-wise maximum: limits measured before and after a benchmark, so that a busy moment
// during one measurement does not flatter the ratios.
MachineLimits BestOf(const MachineLimits& a, const MachineLimits& b);

bool HasLimitLoops();

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

// `bytes` (rounded up to 2 MiB) at a 2 MiB boundary, advised to use huge pages: the engine maps
// checkpoints that way (model/safetensors.cc), so limits and kernels are measured the same way.
void* AllocateStreamingBytes(size_t bytes);

template <typename T>
Buffer<T> Allocate(size_t count) {
  return Buffer<T>(static_cast<T*>(AllocateStreamingBytes(count * sizeof(T))));
}

double NowSeconds();

}  // namespace k3::bench

#endif  // K3SERVE_BENCH_MACHINE_LIMITS_H_
