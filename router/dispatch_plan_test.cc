#include "router/dispatch_plan.h"

#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Every (token, expert) pair reaches exactly the worker hosting the expert, each token goes once
// per worker, and combining per-worker partial sums equals summing the per-pair answers directly.
TEST(DispatchPlanTest, RowsGoOncePerWorkerAndCombineIsTheDirectSum) {
  std::mt19937 rng(3);
  Routing routing;
  routing.tokens = 50;
  routing.top_k = 4;
  routing.num_experts = 16;
  for (int64_t t = 0; t < routing.tokens; ++t) {
    std::set<int32_t> chosen;
    while (chosen.size() < 4) chosen.insert(static_cast<int32_t>(rng() % 16));
    for (int32_t e : chosen) {
      routing.experts.push_back(e);
      routing.weights.push_back(0.1f + static_cast<float>(rng() % 100) / 100.f);
    }
  }
  // Uneven slices: worker 0 hosts 0..2, worker 1 hosts 3..9, worker 2 hosts 10..15.
  auto worker_for = [](int32_t e, int64_t) { return e < 3 ? 0 : (e < 10 ? 1 : 2); };
  DispatchPlan plan;
  BuildDispatchPlan(routing, 3, worker_for, &plan);

  const int64_t width = 3;
  auto answer = [](int64_t token, int32_t expert, int64_t j) {
    return static_cast<float>(token * 100 + expert + j * 0.5);
  };
  std::vector<std::vector<float>> partials(3);
  std::vector<const float*> partial_ptrs;
  for (int w = 0; w < 3; ++w) {
    const WorkerDispatch& d = plan.workers[w];
    std::set<int32_t> unique(d.tokens.begin(), d.tokens.end());
    EXPECT_EQ(unique.size(), d.tokens.size()) << "a token was sent twice to worker " << w;
    partials[w].assign(d.tokens.size() * width, 0.f);
    for (const ExpertAssignment& a : d.assignments) {
      EXPECT_EQ(worker_for(a.expert, 0), w);
      for (int64_t j = 0; j < width; ++j) {
        partials[w][a.row * width + j] += a.weight * answer(d.tokens[a.row], a.expert, j);
      }
    }
    partial_ptrs.push_back(partials[w].data());
  }
  std::vector<float> combined(routing.tokens * width, 0.f);
  CombinePartials(plan, partial_ptrs, width, combined.data());
  for (int64_t t = 0; t < routing.tokens; ++t) {
    for (int64_t j = 0; j < width; ++j) {
      double expected = 0;
      for (int s = 0; s < 4; ++s) {
        expected += routing.weights[t * 4 + s] * answer(t, routing.experts[t * 4 + s], j);
      }
      EXPECT_NEAR(combined[t * width + j], expected, 1e-3 * std::abs(expected));
    }
  }
}

}  // namespace
}  // namespace k3
