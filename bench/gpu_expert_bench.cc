// gpu_expert_bench: one MoE layer's request to an expert worker at K3's shape (16 routed experts
// of d 3584, f 3072, MXFP4; 1 / 4 / 16 rows per expert, each row choosing all 16, as a decode step
// of that many rows), answered by GpuExpertCompute (the worker's GPU path with --device cuda:0:
// rows to bf16 on the host, copies in, both launches, copy back) and by RunExperts on the CPU
// (the worker's path without a GPU, on every core). Rounds interleave the two and the shapes;
// the table gives each one's median round trip and range, and the CPU/GPU ratio.
//
//   bazel-bin/bench/gpu_expert_bench [rounds]     (on a GPU machine: tools/gpu_check.sh runs it)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "expert_nodes/expert_compute.h"
#include "expert_nodes/gpu_expert_compute.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

constexpr int64_t kWidth = 3584, kHidden = 3072;
constexpr int kExperts = 16;

struct Matrix {
  std::vector<uint8_t> codes, scales;
};

Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m;
  m.codes.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 32);
  for (uint8_t& c : m.codes) c = rng() & 0xff;
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(119 + rng() % 3);  // sums of unit size
  return m;
}

double Seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The three MXFP4 matrices (w1, w3: kHidden x kWidth; w2: kWidth x kHidden) of each expert.
std::vector<Matrix> RandomExpertMatrices(std::mt19937& rng) {
  std::vector<Matrix> matrices;
  for (int e = 0; e < kExperts; ++e) {
    for (int m = 0; m < 3; ++m) {
      matrices.push_back(m < 2 ? RandomMatrix(kHidden, kWidth, rng)
                               : RandomMatrix(kWidth, kHidden, rng));
    }
  }
  return matrices;
}

// The experts' weights as views of `matrices` (which must outlive them).
std::vector<GatedMlpWeights> ExpertWeights(const std::vector<Matrix>& matrices) {
  std::vector<GatedMlpWeights> experts;
  for (int e = 0; e < kExperts; ++e) {
    auto view = [&](int m, int64_t rows, int64_t cols) {
      const Matrix& x = matrices[3 * e + m];
      return WeightMatrix{x.codes.data(), WeightType::kMxfp4, rows, cols, x.scales.data()};
    };
    experts.push_back(GatedMlpWeights{view(0, kHidden, kWidth), view(1, kHidden, kWidth),
                                      view(2, kWidth, kHidden)});
  }
  return experts;
}

// One request shape: `rows` rows, each routed to every expert, and its timings.
struct Shape {
  int rows;
  std::vector<float> z, out;
  std::vector<ExpertAssignment> assignments;
  std::vector<double> gpu_seconds, cpu_seconds;
};

std::vector<Shape> RandomShapes(std::mt19937& rng) {
  std::vector<Shape> shapes;
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int rows : {1, 4, 16}) {
    Shape s{rows, std::vector<float>(rows * kWidth), std::vector<float>(rows * kWidth), {}, {}, {}};
    for (float& v : s.z) v = normal(rng);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t e = 0; e < kExperts; ++e) s.assignments.push_back({r, e, 1.0f / kExperts});
    }
    shapes.push_back(std::move(s));
  }
  return shapes;
}

void PrintTable(const std::vector<Shape>& shapes, const GpuExpertCompute& gpu, int rounds) {
  printf("round trips: one MoE layer's request, %d experts of d %lld f %lld (MXFP4, %.0f MB), "
         "CPU on %d kernel threads; median of %d rounds [range]\n",
         kExperts, static_cast<long long>(kWidth), static_cast<long long>(kHidden),
         gpu.weight_bytes() / 1e6, KernelThreadCount(), rounds);
  printf("%-12s %22s %22s %10s\n", "rows/expert", "GPU us", "CPU us", "CPU/GPU");
  for (const Shape& s : shapes) {
    const auto [g_lo, g_hi] = std::minmax_element(s.gpu_seconds.begin(), s.gpu_seconds.end());
    const auto [c_lo, c_hi] = std::minmax_element(s.cpu_seconds.begin(), s.cpu_seconds.end());
    printf("%-12d %8.0f [%5.0f-%5.0f] %8.0f [%5.0f-%5.0f] %10.1f\n", s.rows,
           Median(s.gpu_seconds) * 1e6, *g_lo * 1e6, *g_hi * 1e6, Median(s.cpu_seconds) * 1e6,
           *c_lo * 1e6, *c_hi * 1e6, Median(s.cpu_seconds) / Median(s.gpu_seconds));
  }
}

int Main(int rounds) {
  if (absl::StatusOr<int> devices = CudaDeviceCount(); !devices.ok()) {
    printf("skipped: no GPU (%s)\n", devices.status().ToString().c_str());
    return 0;
  }
  std::mt19937 rng(1);
  const std::vector<Matrix> matrices = RandomExpertMatrices(rng);
  const std::vector<GatedMlpWeights> experts = ExpertWeights(matrices);
  const GluParams params{true, 4.0f, 25.0f};
  absl::StatusOr<std::unique_ptr<GpuExpertCompute>> gpu =
      GpuExpertCompute::Create(experts, params, 0);
  if (!gpu.ok()) {
    fprintf(stderr, "gpu_expert_bench: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  std::vector<Shape> shapes = RandomShapes(rng);
  ExpertScratch scratch;
  bool failed = false;
  auto run_gpu = [&](Shape& s) {
    absl::Status st = (*gpu)->Run(s.z.data(), s.rows, kWidth, s.assignments, s.out.data());
    if (!st.ok()) {
      fprintf(stderr, "gpu: %s\n", st.ToString().c_str());
      failed = true;
    }
  };
  auto run_cpu = [&](Shape& s) {
    absl::Status st = RunExperts(experts, params, s.z.data(), s.rows, kWidth, s.assignments,
                                 s.out.data(), &scratch);
    if (!st.ok()) failed = true;
  };
  for (Shape& s : shapes) {  // warm-up
    run_gpu(s);
    run_cpu(s);
  }
  for (int round = 0; round < rounds && !failed; ++round) {
    for (Shape& s : shapes) {
      s.gpu_seconds.push_back(Seconds([&] { run_gpu(s); }));
      s.cpu_seconds.push_back(Seconds([&] { run_cpu(s); }));
    }
  }
  if (failed) return 1;
  PrintTable(shapes, **gpu, rounds);
  return 0;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) { return k3::Main(argc > 1 ? std::max(3, atoi(argv[1])) : 9); }
