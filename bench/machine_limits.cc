#include "bench/machine_limits.h"

#include <sys/mman.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/kernel_isa.h"

#define K3_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define K3_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define K3_AVX2 __attribute__((target("avx2,fma")))

namespace k3::bench {
namespace {

constexpr int kLimitThreads = 2;                  // the brief's machine limits are for 2 threads
constexpr size_t kStreamBytes = size_t{1} << 30;
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}


// Runs fn(thread) on `threads` threads started together; returns the wall time of the slowest.
double RunOnThreads(int threads, const std::function<void(int)>& fn) {
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      fn(t);
    });
  }
  while (ready.load() < threads) {
  }
  const double start = Now();
  go.store(true);
  for (std::thread& th : pool) th.join();
  return Now() - start;
}

struct Stats {
  double best = 0;
  double median = 0;
};

// ---- (a) read bandwidth -----------------------------------------------------------------------

volatile float g_sink;

// Sums n floats read as kStreams interleaved sequential streams (two accumulators each, in
// registers) into one vector *sum of floats, V: __m512 or __m256, added with GCC's vector
// operators, so that this compiles to the instructions of the ISA of the function it is inlined
// into (the result is not returned by value: a vector return would be an ABI question).
template <typename V, int kStreams>
inline __attribute__((always_inline)) void SumStreamsToVector(const float* p, size_t n, V* sum) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
  const size_t part = n / kStreams / 64 * 64;
  V acc[2 * kStreams];
  for (int s = 0; s < 2 * kStreams; ++s) acc[s] = V{};
  for (size_t i = 0; i < part; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int s = 0; s < kStreams; ++s) {
      const V* q = reinterpret_cast<const V*>(p + s * part + i);
      acc[2 * s] += q[0];
      acc[2 * s + 1] += q[1];
      acc[2 * s] += q[2];
      acc[2 * s + 1] += q[3];
    }
  }
  for (int s = 1; s < 2 * kStreams; ++s) acc[0] += acc[s];
  *sum = acc[0];
}

template <int kStreams>
K3_AVX512 float SumStreams(const float* p, size_t n) {
  __m512 sum;
  SumStreamsToVector<__m512, kStreams>(p, n, &sum);
  return _mm512_reduce_add_ps(sum);
}

// SumStreams for AVX2 (ymm): what an AVX2 kernel can read.
template <int kStreams>
K3_AVX2 float SumStreamsAvx2(const float* p, size_t n) {
  __m256 vector_sum;
  SumStreamsToVector<__m256, kStreams>(p, n, &vector_sum);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vector_sum);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// Whether the loops run at AVX-512 width: the matrix kernels' family (K3SERVE_ISA) is AVX-512 and
// the CPU has vdpbf16ps. Otherwise the AVX2 loops run and the bf16 peak is the fp32 FMA peak
// (what the kernels reach without vdpbf16ps).
bool Avx512Limits() {
  return ActiveKernelIsa() == KernelIsa::kAvx512 && __builtin_cpu_supports("avx512bf16");
}

Stats ReadBandwidth(const float* buffer, size_t n, int streams) {
  std::vector<double> rates;
  for (int rep = 0; rep < 12; ++rep) {
    const double seconds = RunOnThreads(kLimitThreads, [&](int t) {
      const size_t share = n / kLimitThreads;
      const float* part = buffer + t * share;
      if (Avx512Limits()) {
        g_sink = streams == 1 ? SumStreams<1>(part, share) : SumStreams<4>(part, share);
      } else {
        g_sink = streams == 1 ? SumStreamsAvx2<1>(part, share) : SumStreamsAvx2<4>(part, share);
      }
    });
    rates.push_back(n * sizeof(float) / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[rates.size() / 2]};  // higher is better here
}

// ---- (b) compute peaks ------------------------------------------------------------------------

constexpr int64_t kPeakIterations = 2'000'000;  // about 5 ms per run

// The loops' results, summed so that the compiler must compute them.
K3_AVX512 inline float SumAccumulators(__m512 (&acc)[16]) {
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

K3_AVX512 float FmaLoop(float seed) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(seed + i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIterations; ++it) {
#pragma GCC unroll 16  // keeps the accumulators in registers (at -O2 they would live in memory)
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  return SumAccumulators(acc);
}

K3_AVX512_BF16 float Bf16Loop(float seed) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(seed + i);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1, 1)
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // (1e-7, 1e-7)
  for (int64_t it = 0; it < kPeakIterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  return SumAccumulators(acc);
}

// 12 ymm accumulators: enough independent FMAs for two pipes of latency up to 6 cycles.
K3_AVX2 float FmaLoopAvx2(float seed) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(seed + i);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  for (int i = 1; i < 12; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[7];
}

// GFLOP/s of `loop` (`instructions` of `flops_per_instruction` per iteration) on 2 threads.
double Peak(float (*loop)(float), int instructions, double flops_per_instruction) {
  double best = 0;
  for (int rep = 0; rep < 20; ++rep) {  // the best of many short runs finds the quiet moments
    const double seconds =
        RunOnThreads(kLimitThreads, [&](int t) { g_sink = loop(static_cast<float>(t)); });
    best = std::max(best, kLimitThreads * kPeakIterations * instructions * flops_per_instruction /
                              seconds / 1e9);
  }
  return best;
}

}  // namespace

double NowSeconds() { return Now(); }

void* AllocateStreamingBytes(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, bytes);
  if (p != nullptr) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only
  return p;
}

bool HasLimitLoops() { return CpuSupports(KernelIsa::kAvx2); }

MachineLimits MeasureMachineLimits() {
  Buffer<float> buffer = Allocate<float>(kStreamBytes / sizeof(float));
  const size_t floats = kStreamBytes / sizeof(float);
  for (size_t i = 0; i < floats; ++i) buffer[i] = static_cast<float>(i & 1023) * 1e-3f;
  const Stats bw1 = ReadBandwidth(buffer.get(), floats, 1);
  const Stats bw4 = ReadBandwidth(buffer.get(), floats, 4);
  MachineLimits limits;
  limits.read_gbs = std::max(bw1.best, bw4.best);
  if (Avx512Limits()) {
    limits.fma_gflops = Peak(FmaLoop, 16, 32);
    limits.bf16_gflops = Peak(Bf16Loop, 16, 64);
  } else {
    limits.fma_gflops = Peak(FmaLoopAvx2, 12, 16);
    limits.bf16_gflops = limits.fma_gflops;
  }
  std::printf("Read bandwidth, 2 threads over 1 GiB: 1 stream/thread %.1f GB/s (median %.1f), "
              "4 streams/thread %.1f GB/s (median %.1f)\n",
              bw1.best, bw1.median, bw4.best, bw4.median);
  std::printf("Peaks, 2 threads (%s loops): fp32 FMA %.0f GFLOP/s, bf16 %s %.0f GFLOP/s\n",
              Avx512Limits() ? "avx512" : "avx2", limits.fma_gflops,
              Avx512Limits() ? "vdpbf16ps" : "(as fp32 FMA, no vdpbf16ps)", limits.bf16_gflops);
  return limits;
}

MachineLimits BestOf(const MachineLimits& a, const MachineLimits& b) {
  return {std::max(a.read_gbs, b.read_gbs), std::max(a.fma_gflops, b.fma_gflops),
          std::max(a.bf16_gflops, b.bf16_gflops)};
}

}  // namespace k3::bench
