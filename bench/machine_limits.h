// MachineLimits: this machine's read bandwidth and compute peaks, measured in the same run as a
// benchmark so that the benchmark can report its speed as a fraction of them (the machine is
// shared and noisy; ratios measured together are what holds).
#ifndef K3SERVE_BENCH_MACHINE_LIMITS_H_
#define K3SERVE_BENCH_MACHINE_LIMITS_H_

#include <cstddef>

namespace k3::bench {

struct MachineLimits {
  double read_gbs = 0;     // best of 1 and 4 streams per thread, 2 threads, over 1 GiB
  double fma_gflops = 0;   // fp32 FMA (zmm), 2 threads
  double bf16_gflops = 0;  // vdpbf16ps (zmm), 2 threads
};

// Measures the limits on 2 threads (a few seconds) and prints them. REQUIRES: AVX-512 with
// avx512_bf16 (HasLimitLoops()).
MachineLimits MeasureMachineLimits();

// The element-wise maximum: limits measured before and after a benchmark, so that a busy moment
// during one measurement does not flatter the ratios.
MachineLimits BestOf(const MachineLimits& a, const MachineLimits& b);

bool HasLimitLoops();

double NowSeconds();

}  // namespace k3::bench

#endif  // K3SERVE_BENCH_MACHINE_LIMITS_H_
