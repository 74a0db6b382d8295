// qb_bench: what the QB statistics cost a router, per routed token, next to the router's own step.
//
//   bazel run //bench:qb_bench            (about 30 s)
//
// For one MoE layer of two shapes, k3-perf (d 1024, 64 experts, top-8) and K3 (d 7168, 896
// experts, top-16), and several batch sizes, it times
//   router: the router's step, RouteTokens of router/gate.h: the BF16 gate matmul via k3::MatMul
//           on the kernel pool, sigmoid, top-k of s + bias, weight renormalization;
//   stats:  QbLayerStatistics::RecordRouted on the router's scores and choices (α and 1000-bin
//           histograms of r for every expert, plus loads), single-threaded;
//   stats+select: QbLayerStatistics::Record, which redoes the top-(k+1) selection itself;
// and prints each per token and the ratio stats / router. Calls cycle through 4096 distinct
// tokens. Gate weights are reused across calls, so they stay in cache: the router time is a lower
// bound and the ratio an upper bound. Each time is the best of several repetitions (the machine is
// shared and noisy). Needs about 200 MB of memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/matmul.h"
#include "kernels/thread_pool.h"
#include "router/gate.h"
#include "moe/qb_statistics.h"

namespace k3 {
namespace {

constexpr int kRepetitions = 5;
constexpr double kSecondsPerRepetition = 0.1;
constexpr int64_t kPoolTokens = 4096;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best seconds per call of fn over kRepetitions runs of at least kSecondsPerRepetition each.
double BestSecondsPerCall(const std::function<void()>& fn) {
  fn();  // warm up
  double best = 1e30;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    int64_t calls = 0;
    const double start = Now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = Now() - start;
    } while (elapsed < kSecondsPerRepetition);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

struct Shape {
  const char* name;
  int hidden;
  int experts;
  int top_k;
};

void Run(const Shape& shape, int64_t tokens) {
  // Successive calls take successive batches from a pool of kPoolTokens distinct tokens: repeating
  // one small batch lets the branch predictor learn the top-k comparisons and flatters both sides.
  const int64_t batches = std::max<int64_t>(1, kPoolTokens / tokens);
  const int64_t rows = batches * tokens;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> gate(static_cast<size_t>(shape.experts) * shape.hidden);
  for (uint16_t& w : gate) w = FloatToBf16(0.02f * normal(rng));
  std::vector<float> x(static_cast<size_t>(rows) * shape.hidden);
  for (float& v : x) v = normal(rng);

  // The router's own step, router/gate.cc's RouteTokens, on a config of this shape.
  ModelConfig config;
  config.hidden_size = shape.hidden;
  config.num_experts = shape.experts;
  config.num_experts_per_token = shape.top_k;
  RouterWeights router_weights;
  router_weights.gate = WeightMatrix{gate.data(), WeightType::kBf16, shape.experts, shape.hidden};
  router_weights.score_bias.resize(shape.experts);
  for (float& b : router_weights.score_bias) b = 0.01f * normal(rng);
  const std::vector<float>& bias = router_weights.score_bias;
  std::vector<Routing> routings(batches);
  auto step = [&](int64_t batch) {
    RouteTokens(router_weights, config, &x[batch * tokens * shape.hidden], tokens,
                &routings[batch]);
  };
  for (int64_t b = 0; b < batches; ++b) step(b);  // every batch's scores and choices, for stats
  int64_t next = 0;
  const double router = BestSecondsPerCall([&] { step(next++ % batches); });

  auto stats = QbLayerStatistics::Create(1, shape.top_k, bias);
  if (!stats.ok()) {
    std::fprintf(stderr, "%s\n", stats.status().ToString().c_str());
    return;
  }
  const double record_routed = BestSecondsPerCall([&] {
    const Routing& routing = routings[next++ % batches];
    stats->RecordRouted(routing.scores.data(), routing.experts.data(), tokens);
  });
  const double record = BestSecondsPerCall(
      [&] { stats->Record(routings[next++ % batches].scores.data(), tokens); });
  const double us = 1e6 / tokens;
  std::printf(
      "%-8s d=%-5d E=%-4d k=%-3d tokens=%-4lld router %8.3f us/token  stats %7.3f "
      "(%5.1f%%)  stats+select %7.3f (%5.1f%%)\n",
      shape.name, shape.hidden, shape.experts, shape.top_k, static_cast<long long>(tokens),
      router * us, record_routed * us, 100 * record_routed / router, record * us,
      100 * record / router);
}

}  // namespace
}  // namespace k3

int main() {
  std::printf("kernel threads: %d; histograms: %d bins per expert (K3: %.1f MB per layer)\n",
              k3::KernelThreadCount(), k3::QbLayerStatistics::kDefaultBins,
              896.0 * k3::QbLayerStatistics::kDefaultBins * 8 / 1e6);
  const k3::Shape shapes[] = {{"k3-perf", 1024, 64, 8}, {"K3", 7168, 896, 16}};
  for (const k3::Shape& shape : shapes) {
    for (int64_t tokens : {1, 16, 128, 1024}) k3::Run(shape, tokens);
  }
  return 0;
}
