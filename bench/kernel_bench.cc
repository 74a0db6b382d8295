// kernel_bench: the machine's limits and k3::MatMul against them and against oneDNN, in one run.
//
//   bazel run //bench:kernel_bench            (about a minute; needs ~1.3 GB of memory)
//   bazel run //bench:kernel_bench -- --mxfp4-only     (just the limits and (e))
//   bazel run //bench:kernel_bench -- --decode-only    (just the limits and (f))
//
// Prints (a) read bandwidth (2 threads streaming a 1 GiB buffer), (b) fp32 FMA and bf16 vdpbf16ps
// peaks (2 threads, independent accumulators), (c) k3::MatMul on M x K x N = tokens x in x out with
// W [N, K] in BF16 and F32, weights cold (each call uses the next of a rotation of copies filling
// 1 GiB, more than the last-level cache), and (d) oneDNN's matmul on the same shapes and weights:
// f32, and bf16 weights with bf16 activations (converted before timing, so oneDNN skips that work).
// Times are per call; "best" is the 10th percentile of calls, "median" the median. k3 and oneDNN
// run in alternating rounds. The machine is shared and noisy: compare ratios measured in the same
// run, and the limits are taken as the best of a measurement before and one after. (e) MXFP4
// expert products at K3's expert shapes (16 experts per step) against read bandwidth, beside BF16,
// and for 1 token also on one thread, which tells whether the product is bound by memory or by
// instructions. (f) BF16 1-token products at the sizes of a k3-perf decode step, weights cold in
// scattered order, on one thread and on all.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>
// GCC 12's AVX-512 headers initialize their "undefined" vectors from themselves (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "bench/machine_limits.h"
#include "kernels/bf16.h"
#include "kernels/kernel_isa.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"
#include "kernels/thread_pool.h"

namespace k3::bench {
namespace {

constexpr int kLimitThreads = 2;                  // the brief's machine limits are for 2 threads
constexpr size_t kStreamBytes = size_t{1} << 30;  // bandwidth buffer and weight rotation set
constexpr int kRounds = 4;  // per shape, alternating k3 and oneDNN
constexpr double kSecondsPerRound = 0.12;
constexpr int kMinCallsPerRound = 2;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}


struct Stats {
  double best = 0;
  double median = 0;
};

// Times: best is the 10th percentile.
Stats Summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 10], samples[samples.size() / 2]};
}

// ---- thread pool overhead ---------------------------------------------------------------------

void ThreadPoolOverhead() {
  std::atomic<int64_t> touched{0};
  const auto fn = [&](int64_t begin, int64_t end) { touched.fetch_add(end - begin); };
  constexpr int kHot = 200'000;
  for (int i = 0; i < 1000; ++i) ParallelFor(2, 1, fn);
  double start = Now();
  for (int i = 0; i < kHot; ++i) ParallelFor(2, 1, fn);
  const double hot = (Now() - start) / kHot;
  std::vector<double> cold;
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers stop spinning
    start = Now();
    ParallelFor(2, 1, fn);
    cold.push_back(Now() - start);
  }
  Stats s = Summarize(cold);
  std::printf("ParallelFor (2 chunks, empty work): back-to-back %.2f us/call; after 2 ms idle "
              "%.1f us (median %.1f)\n\n",
              hot * 1e6, s.best * 1e6, s.median * 1e6);
}

// ---- (c, d) matrix products -------------------------------------------------------------------

using Limits = MachineLimits;

// Fills `words` 32-bit words so that both views are sane: as f32 every word is a normal number in
// [-1, 1]; as bf16 both halves are.
void FillWeights(uint32_t* words, size_t count) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-1.0f, 1.0f), narrow(0.5f, 1.0f);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t high = FloatToBf16(wide(rng));
    uint32_t low = FloatToBf16(narrow(rng));
    if (rng() & 1) low |= 0x8000;
    words[i] = high << 16 | low;
  }
}

struct Result {
  std::string name;
  Stats seconds;
  bool valid = true;
};

// Times two implementations in alternating rounds, so that both meet the same background load;
// each call uses the next weight copy. A warm-up call first.
std::pair<Stats, Stats> TimePair(int copies, const std::function<void(int)>& a,
                                 const std::function<void(int)>& b) {
  std::vector<double> samples[2];
  const std::function<void(int)>* calls[2] = {&a, &b};
  int copy = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int which = 0; which < 2; ++which) {
      // Let the other library's spinning threads (ours, OpenMP's) go idle first.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (round == 0) (*calls[which])(copy++ % copies);
      const double start = Now();
      int calls_made = 0;
      while (calls_made < kMinCallsPerRound || Now() - start < kSecondsPerRound) {
        const double t0 = Now();
        (*calls[which])(copy++ % copies);
        samples[which].push_back(Now() - t0);
        ++calls_made;
      }
    }
  }
  return {Summarize(samples[0]), Summarize(samples[1])};
}

class DnnlMatMul {
 public:
  // Weights [N, K] row-major are oneDNN's K x N weights in format `ba`.
  DnnlMatMul(int64_t m, int64_t k, int64_t n, bool bf16)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt in_type = bf16 ? dt::bf16 : dt::f32;
    src_md_ = dnnl::memory::desc({m, k}, in_type, tag::ab);
    weights_md_ = dnnl::memory::desc({k, n}, in_type, tag::ba);
    dst_md_ = dnnl::memory::desc({m, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md_, weights_md_, dst_md_), engine_);
    impl_ = pd.impl_info_str();
    primitive_ = dnnl::matmul(pd);
  }

  void Run(const void* src, const void* weights, float* dst) {
    dnnl::memory src_mem(src_md_, engine_, const_cast<void*>(src));
    dnnl::memory weights_mem(weights_md_, engine_, const_cast<void*>(weights));
    dnnl::memory dst_mem(dst_md_, engine_, dst);
    primitive_.execute(stream_, {{DNNL_ARG_SRC, src_mem},
                                 {DNNL_ARG_WEIGHTS, weights_mem},
                                 {DNNL_ARG_DST, dst_mem}});
    stream_.wait();
  }

  const std::string& impl() const { return impl_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::memory::desc src_md_, weights_md_, dst_md_;
  dnnl::matmul primitive_;
  std::string impl_;
};

struct Shape {
  int64_t k, n;
};

// Largest |a - b| relative to the largest |b|.
double MaxRelativeDifference(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// One shape and weight type: k3 and oneDNN.
struct Row {
  int64_t m, k, n;
  bool bf16;
  Result ours, peer;
  std::string peer_impl;
  double difference;  // max relative difference of the outputs
};

// A progress line on stdout: `what` when made, a dot per Dot(), the line's end when destroyed.
class ProgressDots {
 public:
  explicit ProgressDots(const char* what) {
    std::printf("%s", what);
    std::fflush(stdout);
  }
  ~ProgressDots() { std::printf("\n"); }
  ProgressDots(const ProgressDots&) = delete;
  ProgressDots& operator=(const ProgressDots&) = delete;

  void Dot() {
    std::printf(".");
    std::fflush(stdout);
  }
};

std::vector<Row> BenchShapes(uint32_t* weight_pool) {
  const Shape shapes[] = {{2048, 1536}, {7168, 3584}};
  const int64_t token_counts[] = {1, 8, 64, 256};
  std::vector<Row> rows;
  ProgressDots progress("Timing matrix products");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& shape : shapes) {
    const int64_t max_m = 256;
    std::vector<float> x(max_m * shape.k);
    for (float& v : x) v = dist(rng);
    std::vector<uint16_t> x_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = FloatToBf16(x[i]);
    std::vector<float> y(max_m * shape.n), y_peer(max_m * shape.n);

    for (int64_t m : token_counts) {
      for (WeightType type : {WeightType::kBf16, WeightType::kF32}) {
        const bool bf16 = type == WeightType::kBf16;
        const size_t bytes = shape.k * shape.n * (bf16 ? 2 : 4);
        const int copies = static_cast<int>(std::max<size_t>(2, kStreamBytes / bytes));
        const char* base = reinterpret_cast<const char*>(weight_pool);
        auto weights = [&](int copy) { return base + copy * bytes; };
        const void* peer_x = bf16 ? static_cast<const void*>(x_bf16.data()) : x.data();

        Row row{m, shape.k, shape.n, bf16};
        DnnlMatMul peer_op(m, shape.k, shape.n, bf16);
        const auto [ours, peer] = TimePair(
            copies,
            [&](int copy) {
              WeightMatrix w{weights(copy), type, shape.n, shape.k};
              MatMul(w, x.data(), shape.k, m, y.data(), shape.n, false);
            },
            [&](int copy) { peer_op.Run(peer_x, weights(copy), y_peer.data()); });
        row.ours = {bf16 ? "k3 bf16" : "k3 f32", ours};
        row.peer = {bf16 ? "oneDNN bf16" : "oneDNN f32", peer};
        row.peer_impl = peer_op.impl();
        // Same inputs once more to cross-check the outputs (oneDNN bf16 rounds x: looser).
        WeightMatrix w{weights(0), type, shape.n, shape.k};
        MatMul(w, x.data(), shape.k, m, y.data(), shape.n, false);
        peer_op.Run(peer_x, weights(0), y_peer.data());
        row.difference = MaxRelativeDifference(y.data(), y_peer.data(), m * shape.n);
        row.ours.valid = row.difference < (bf16 ? 2e-2 : 1e-4);
        rows.push_back(row);
        progress.Dot();
      }
    }
  }
  return rows;
}

void PrintResult(const Result& r, const Row& row, const Limits& limits, const Result* peer) {
  const double seconds = r.seconds.best;
  const double gbs = row.k * row.n * (row.bf16 ? 2.0 : 4.0) / seconds / 1e9;
  const double gflops = 2.0 * row.m * row.k * row.n / seconds / 1e9;
  std::printf("  %-12s %10.1f %10.1f %8.1f %8.1f %7.0f%% %7.0f%% %7.0f%%", r.name.c_str(),
              seconds * 1e6, r.seconds.median * 1e6, gbs, gflops, 100 * gbs / limits.read_gbs,
              100 * gflops / limits.bf16_gflops, 100 * gflops / limits.fma_gflops);
  if (peer != nullptr) {
    std::printf("   %5.2fx (median %4.2fx)", peer->seconds.best / seconds,
                peer->seconds.median / r.seconds.median);
  }
  std::printf("%s\n", r.valid ? "" : "   RESULT MISMATCH");
}

void PrintTable(const std::vector<Row>& rows, const Limits& limits) {
  std::printf(
      "Matrix products M x K x N = tokens x in x out, W [N, K], weights cold (rotating over 1 GiB\n"
      "of copies). Time per call in us (best = 10th percentile, and median); weight GB/s and\n"
      "GFLOP/s at the best time, as a fraction of read bandwidth, bf16 peak and fp32 FMA peak;\n"
      "k3 speed relative to oneDNN with the same weight type (>1: k3 faster). oneDNN bf16 gets\n"
      "its activations in bf16 (converted before timing); k3 keeps them fp32.\n");
  std::printf("\n  %-12s %10s %10s %8s %8s %8s %8s %8s   %s\n", "impl", "best_us", "median_us",
              "GB/s", "GFLOP/s", "%readBW", "%bf16pk", "%fp32pk", "k3 vs oneDNN");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (i == 0 || rows[i - 1].m != row.m || rows[i - 1].k != row.k) {
      std::printf("\n%lld x %lld x %lld\n", static_cast<long long>(row.m),
                  static_cast<long long>(row.k), static_cast<long long>(row.n));
    }
    PrintResult(row.ours, row, limits, &row.peer);
    PrintResult(row.peer, row, limits, nullptr);
    std::printf("  %-12s oneDNN impl %s; max rel diff %.1e\n", "", row.peer_impl.c_str(),
                row.difference);
  }

  std::printf("\nSummary, BF16 weights (decode: share of read bandwidth; prefill: share of bf16 and "
              "fp32 peak):\n");
  for (const Row& row : rows) {
    if (!row.bf16) continue;
    const double seconds = row.ours.seconds.best;
    const double gbs = row.k * row.n * 2.0 / seconds / 1e9;
    const double gflops = 2.0 * row.m * row.k * row.n / seconds / 1e9;
    std::printf("  %3lld x %4lld x %4lld  ", static_cast<long long>(row.m),
                static_cast<long long>(row.k), static_cast<long long>(row.n));
    if (row.m <= 8) {
      std::printf("%5.1f GB/s = %3.0f%% of read bandwidth", gbs, 100 * gbs / limits.read_gbs);
    } else {
      std::printf("%5.0f GFLOP/s = %3.0f%% of bf16 peak, %3.0f%% of fp32 peak", gflops,
                  100 * gflops / limits.bf16_gflops, 100 * gflops / limits.fma_gflops);
    }
    std::printf("; %.2fx oneDNN bf16\n", row.peer.seconds.best / seconds);
  }
}

// ---- (e) MXFP4 expert products ----------------------------------------------------------------

struct Mxfp4Row {
  const char* name;
  int64_t out, in, tokens;
  Stats mxfp4, bf16;
  Stats int8;  // MXFP4 with 8-bit activations (K3SERVE_MXFP4_ACTIVATIONS=int8)
  // 1 token only: the same products on one thread (the pool's other threads idle), to tell a
  // product bound by instruction throughput (it scales with threads) from one bound by bandwidth.
  bool has_one_thread = false;
  Stats mxfp4_one_thread, bf16_one_thread, int8_one_thread;
  double mxfp4_bytes, bf16_bytes;  // weight bytes per step
};

// Runs fn on one thread of the kernel pool: a two-chunk job whose second chunk is empty, so the
// products inside it run inline (kernels/thread_pool.h: nested ParallelFor calls do).
void OnOneThread(const std::function<void()>& fn) {
  k3::ParallelFor(2, 1, [&](int64_t begin, int64_t) {
    if (begin == 0) fn();
  });
}

// One decode step's worth of expert products at K3's expert shapes: 16 experts, each a product
// with its own cold weights, for 1, 4 and 16 tokens per expert; MXFP4 against BF16 in alternating
// rounds. Weight bytes: MXFP4 codes + scales (17/32 bytes per weight), BF16 2 per weight.
std::vector<Mxfp4Row> BenchMxfp4(uint32_t* weight_pool) {
  constexpr int kExperts = 16;
  // Valid scales (2^-7 .. 2^3) in their own pool; the codes reuse the weight pool (any byte is
  // two valid codes).
  Buffer<uint8_t> scale_pool = Allocate<uint8_t>(kStreamBytes / 16);
  std::mt19937 rng(5);
  for (size_t i = 0; i < kStreamBytes / 16; ++i) {
    scale_pool[i] = static_cast<uint8_t>(120 + rng() % 11);
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const char* base = reinterpret_cast<const char*>(weight_pool);
  std::vector<Mxfp4Row> rows;
  ProgressDots progress("Timing MXFP4 expert products");
  for (const Mxfp4Row shape : {Mxfp4Row{"w1/w3", 3072, 3584}, Mxfp4Row{"w2", 3584, 3072}}) {
    const int64_t weights = shape.out * shape.in;
    const int64_t mx_copies = kStreamBytes / (weights / 2);
    const int64_t bf16_copies = kStreamBytes / (weights * 2);
    for (int64_t m : {1, 4, 16}) {
      std::vector<float> x(m * shape.in), y(m * shape.out);
      for (float& v : x) v = dist(rng);
      // The mode is set per call: the int8 rounds alternate with fp32 ones.
      auto step = [&](WeightType type, int index,
                      Mxfp4Activations mode = Mxfp4Activations::kFp32) {
        SetMxfp4Activations(mode);
        for (int e = 0; e < kExperts; ++e) {
          const int64_t copy = (int64_t{index} * kExperts + e) %
                               (type == WeightType::kMxfp4 ? mx_copies : bf16_copies);
          WeightMatrix w{base + copy * weights * (type == WeightType::kMxfp4 ? 1 : 4) / 2, type,
                         shape.out, shape.in};
          if (type == WeightType::kMxfp4) w.scales = scale_pool.get() + copy * (weights / 32);
          MatMul(w, x.data(), shape.in, m, y.data(), shape.out, false);
        }
      };
      Mxfp4Row row = shape;
      row.tokens = m;
      std::tie(row.mxfp4, row.bf16) = TimePair(
          1 << 30, [&](int i) { step(WeightType::kMxfp4, i); },
          [&](int i) { step(WeightType::kBf16, i); });
      const auto int8 = [&](int i) { step(WeightType::kMxfp4, i, Mxfp4Activations::kInt8); };
      row.int8 = TimePair(1 << 30, int8, [&](int i) { step(WeightType::kMxfp4, i); }).first;
      if (m == 1 && KernelThreadCount() > 1) {
        row.has_one_thread = true;
        std::tie(row.mxfp4_one_thread, row.bf16_one_thread) = TimePair(
            1 << 30, [&](int i) { OnOneThread([&] { step(WeightType::kMxfp4, i); }); },
            [&](int i) { OnOneThread([&] { step(WeightType::kBf16, i); }); });
        row.int8_one_thread =
            TimePair(1 << 30, [&](int i) { OnOneThread([&] { int8(i); }); },
                     [&](int i) { OnOneThread([&] { step(WeightType::kMxfp4, i); }); })
                .first;
      }
      SetMxfp4Activations(Mxfp4Activations::kFp32);
      row.mxfp4_bytes = kExperts * (weights / 2.0 + weights / 32.0);
      row.bf16_bytes = kExperts * weights * 2.0;
      rows.push_back(row);
      progress.Dot();
    }
  }
  return rows;
}

void PrintMxfp4(const std::vector<Mxfp4Row>& rows, const Limits& limits) {
  std::printf(
      "\nMXFP4 expert products at K3 shapes, 16 experts per step, weights cold (best = 10th\n"
      "percentile of steps); GB/s of weight bytes (MXFP4: codes + scales) as a fraction of\n"
      "read bandwidth (goal for 1 token: >= 0.6 with fp32 activations, >= 0.8 with int8), BF16\n"
      "and MXFP4 with 8-bit activations (int8) alongside:\n");
  std::printf("  %-6s %11s %6s %11s %11s %7s %7s %11s %7s %7s %8s %10s %7s %7s\n", "matrix",
              "out x in", "tokens", "mx_best_us", "mx_med_us", "GB/s", "readBW", "bf16_us", "GB/s",
              "readBW", "speedup", "int8_us", "GB/s", "readBW");
  for (const Mxfp4Row& r : rows) {
    const double mx_gbs = r.mxfp4_bytes / r.mxfp4.best / 1e9;
    const double bf16_gbs = r.bf16_bytes / r.bf16.best / 1e9;
    const double int8_gbs = r.mxfp4_bytes / r.int8.best / 1e9;
    std::printf("  %-6s %5lld x %4lld %6lld %11.1f %11.1f %7.1f %7.2f %11.1f %7.1f %7.2f %7.2fx "
                "%10.1f %7.1f %7.2f\n",
                r.name, static_cast<long long>(r.out), static_cast<long long>(r.in),
                static_cast<long long>(r.tokens), r.mxfp4.best * 1e6, r.mxfp4.median * 1e6, mx_gbs,
                mx_gbs / limits.read_gbs, r.bf16.best * 1e6, bf16_gbs, bf16_gbs / limits.read_gbs,
                r.bf16.best / r.mxfp4.best, r.int8.best * 1e6, int8_gbs,
                int8_gbs / limits.read_gbs);
  }
  std::printf(
      "\n1 token on one thread vs all %d (weights cold as above). BF16 on one thread shows what\n"
      "one core can read; MXFP4 on one thread below that is bound by the core's instruction\n"
      "throughput, not by memory, and gains only from more cores:\n",
      KernelThreadCount());
  for (const Mxfp4Row& r : rows) {
    if (!r.has_one_thread) continue;
    const double mx1 = r.mxfp4_bytes / r.mxfp4_one_thread.best / 1e9;
    const double mxn = r.mxfp4_bytes / r.mxfp4.best / 1e9;
    const double bf1 = r.bf16_bytes / r.bf16_one_thread.best / 1e9;
    const double bfn = r.bf16_bytes / r.bf16.best / 1e9;
    const double i81 = r.mxfp4_bytes / r.int8_one_thread.best / 1e9;
    const double i8n = r.mxfp4_bytes / r.int8.best / 1e9;
    std::printf("  %-6s MXFP4 %5.1f -> %5.1f GB/s (%.2fx), int8 %5.1f -> %5.1f GB/s (%.2fx), "
                "BF16 %5.1f -> %5.1f GB/s (%.2fx); read bandwidth %.1f GB/s\n",
                r.name, mx1, mxn, mxn / mx1, i81, i8n, i8n / i81, bf1, bfn, bfn / bf1,
                limits.read_gbs);
  }
}

// ---- (f) decode-sized BF16 products -----------------------------------------------------------

struct DecodeRow {
  const char* name;
  int64_t out, in;
  Stats one_thread, all_threads;
};

// One token through BF16 matrices of the sizes a k3-perf decode step multiplies (spec 12.6) and one
// of K3's, each call on the next matrix of a scattered order over the 1 GiB pool (a decode step
// reads its routed experts wherever the router sends it, not one after another), on one thread
// and on all. Small matrices stream slower per core than large ones: this shows how much.
std::vector<DecodeRow> BenchDecodeShapes(uint32_t* weight_pool) {
  std::vector<DecodeRow> rows = {
      DecodeRow{"k3-perf routed expert", 512, 512}, DecodeRow{"k3-perf attention", 1024, 1024},
      DecodeRow{"k3-perf shared gate/up", 2048, 1024}, DecodeRow{"k3-perf lm_head", 4096, 1024},
      DecodeRow{"K3 expert w1 (BF16)", 3072, 3584}};
  ProgressDots progress("Timing decode-sized products");
  std::vector<float> x(8192, 0.5f), y(8192);
  for (DecodeRow& row : rows) {
    const int64_t bytes = row.out * row.in * 2;
    const int64_t copies = static_cast<int64_t>(kStreamBytes) / bytes;
    const char* base = reinterpret_cast<const char*>(weight_pool);
    auto call = [&](int i) {
      // A multiplicative hash of i: consecutive calls land far apart in the pool.
      const int64_t copy = static_cast<int64_t>((static_cast<uint64_t>(i) * 2654435761u) % copies);
      WeightMatrix w{base + copy * bytes, WeightType::kBf16, row.out, row.in};
      MatMul(w, x.data(), row.in, 1, y.data(), row.out, false);
    };
    std::tie(row.one_thread, row.all_threads) = TimePair(
        1 << 30, [&](int i) { OnOneThread([&] { call(i); }); }, call);
    progress.Dot();
  }
  return rows;
}

void PrintDecodeShapes(const std::vector<DecodeRow>& rows, double read_gbs) {
  std::printf(
      "\nBF16 1-token products at decode sizes, weights cold in scattered order (best = 10th\n"
      "percentile): GB/s of weights on one thread and on all %d, and the latter as a fraction of\n"
      "read bandwidth (%.1f GB/s):\n",
      KernelThreadCount(), read_gbs);
  for (const DecodeRow& r : rows) {
    const double bytes = r.out * r.in * 2.0;
    const double one = bytes / r.one_thread.best / 1e9, all = bytes / r.all_threads.best / 1e9;
    std::printf("  %-24s %5lld x %4lld  %5.2f MB  1 thread %5.1f GB/s  all %5.1f GB/s  %5.2f\n",
                r.name, static_cast<long long>(r.out), static_cast<long long>(r.in), bytes / 1e6,
                one, all, all / read_gbs);
  }
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) {
  using namespace k3::bench;
  const double start = Now();
  if (!HasLimitLoops()) {
    std::printf("kernel_bench needs AVX2 for its limit loops\n");
    return 1;
  }
  std::printf("k3 kernel_bench: kernel pool %d threads (K3SERVE_THREADS), limits on %d threads, "
              "matrix kernels %s (K3SERVE_ISA)\n\n",
              k3::KernelThreadCount(), kLimitThreads, k3::KernelIsaName(k3::ActiveKernelIsa()));

  Buffer<uint32_t> pool = Allocate<uint32_t>(kStreamBytes / 4);
  FillWeights(pool.get(), kStreamBytes / 4);
  // Limits are measured before and after the products and the best kept: on a shared machine a
  // single measurement may land in a busy moment.
  Limits limits = MeasureMachineLimits();
  if (argc > 1 && std::string(argv[1]) == "--mxfp4-only") {
    std::vector<Mxfp4Row> rows = BenchMxfp4(pool.get());
    limits = BestOf(limits, MeasureMachineLimits());
    std::printf("\nLimits (best of before and after): read %.1f GB/s\n", limits.read_gbs);
    PrintMxfp4(rows, limits);
    std::printf("\ntotal %.0f s\n", Now() - start);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--decode-only") {
    std::vector<DecodeRow> rows = BenchDecodeShapes(pool.get());
    limits = BestOf(limits, MeasureMachineLimits());
    PrintDecodeShapes(rows, limits.read_gbs);
    std::printf("\ntotal %.0f s\n", Now() - start);
    return 0;
  }
  ThreadPoolOverhead();
  std::vector<Row> rows = BenchShapes(pool.get());
  std::vector<Mxfp4Row> mxfp4_rows = BenchMxfp4(pool.get());
  std::vector<DecodeRow> decode_rows = BenchDecodeShapes(pool.get());
  limits = BestOf(limits, MeasureMachineLimits());
  std::printf("\nLimits (best of before and after): read %.1f GB/s, fp32 FMA %.0f GFLOP/s, bf16 %.0f "
              "GFLOP/s\n\n",
              limits.read_gbs, limits.fma_gflops, limits.bf16_gflops);
  PrintTable(rows, limits);
  PrintMxfp4(mxfp4_rows, limits);
  PrintDecodeShapes(decode_rows, limits.read_gbs);
  std::printf("\ntotal %.0f s\n", Now() - start);
  return 0;
}
