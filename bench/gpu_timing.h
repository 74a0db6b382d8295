// What the CUDA benches (attention_gpu_bench, moe_mxfp4_bench, gpu_step_bench) share: CHECK_CUDA,
// the device line, and timing calls on a stream with CUDA events. Header-only host code (cudart
// only), for nvcc and the host compiler alike.
#ifndef K3SERVE_BENCH_GPU_TIMING_H_
#define K3SERVE_BENCH_GPU_TIMING_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Exits with status 1, naming the call and CUDA's error, when `call` does not return cudaSuccess.
#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e = (call);                                                                \
    if (e != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

namespace k3 {

// True, after printing "skipped: no GPU (reason)", when no CUDA device is usable: a bench then
// exits 0, as the GPU tests report themselves skipped (tools/gpu_check.sh counts it as skipped).
inline bool NoGpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return false;
  printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
  return true;
}

// Prints device 0's name, SM count and L2 size, the line a bench's output starts with.
inline void PrintDevice() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize / 1e6);
}

// The upper median. REQUIRES: v is not empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `run` (which queues its work on `stream`), timed over `calls` calls with
// events.
template <typename F>
double TimeOnStream(F run, int calls, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < calls; ++i) run();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms * 1e-3 / calls;
}

}  // namespace k3

#endif  // K3SERVE_BENCH_GPU_TIMING_H_
