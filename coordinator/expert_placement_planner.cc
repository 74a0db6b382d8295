#include "coordinator/expert_placement_planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

// Per-worker load when each expert's load splits evenly over hosts[expert].
std::vector<double> WorkerLoads(const std::vector<std::vector<int>>& hosts,
                                absl::Span<const double> loads, int workers) {
  std::vector<double> worker_load(workers, 0.0);
  for (size_t e = 0; e < hosts.size(); ++e) {
    for (int w : hosts[e]) worker_load[w] += loads[e] / static_cast<double>(hosts[e].size());
  }
  return worker_load;
}

// Step 1: replica counts for one layer, `extra` replicas beyond one per expert.
std::vector<int> CountReplicas(const std::vector<double>& loads, int64_t extra, int max_replicas) {
  const int n = static_cast<int>(loads.size());
  std::vector<int> replicas(n, 1);
  for (int64_t x = 0; x < extra; ++x) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (replicas[e] >= max_replicas) continue;
      if (best < 0 || loads[e] / replicas[e] > loads[best] / replicas[best]) best = e;
    }
    ++replicas[best];
  }
  return replicas;
}

// Step 2: packs the replicas of one layer; returns hosts[expert], in placement order.
std::vector<std::vector<int>> PackReplicas(const std::vector<double>& loads,
                                           const std::vector<int>& replicas,
                                           const std::vector<int>& worker_slots) {
  const int n = static_cast<int>(loads.size());
  const int workers = static_cast<int>(worker_slots.size());
  struct Item {
    double share;
    int expert;
  };
  std::vector<Item> items;
  for (int e = 0; e < n; ++e) {
    for (int r = 0; r < replicas[e]; ++r) items.push_back({loads[e] / replicas[e], e});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.share > b.share; });
  std::vector<double> worker_load(workers, 0.0);
  std::vector<int> free_slots = worker_slots;
  std::vector<std::vector<int>> hosts(n);
  for (const Item& item : items) {
    const std::vector<int>& held = hosts[item.expert];
    int best = -1;
    for (int w = 0; w < workers; ++w) {
      if (free_slots[w] == 0) continue;
      if (std::find(held.begin(), held.end(), w) != held.end()) continue;
      // Among equally loaded workers the one with fewer free slots: a worker with many will still
      // collect many of the smaller replicas.
      if (best < 0 || worker_load[w] < worker_load[best] ||
          (worker_load[w] == worker_load[best] && free_slots[w] < free_slots[best])) {
        best = w;
      }
    }
    if (best < 0) continue;  // dropped: the expert's placed replicas take its share
    hosts[item.expert].push_back(best);
    worker_load[best] += item.share;
    --free_slots[best];
  }
  return hosts;
}

// Step 3: local search on the packed layer. While the most loaded worker can shed load by moving
// one of its replicas to a worker with a free slot, or by swapping it for a smaller replica there,
// apply the change that lowers the larger of the two loads most. Each change strictly lowers the
// sum of squared worker loads, so the search ends.
void ImproveByMovesAndSwaps(const std::vector<double>& loads, const std::vector<int>& worker_slots,
                            std::vector<std::vector<int>>* hosts) {
  const int n = static_cast<int>(loads.size());
  const int workers = static_cast<int>(worker_slots.size());
  std::vector<double> share(n);
  std::vector<std::vector<int>> held(workers);  // experts on each worker
  std::vector<double> worker_load(workers, 0.0);
  for (int e = 0; e < n; ++e) {
    share[e] = loads[e] / static_cast<double>((*hosts)[e].size());
    for (int w : (*hosts)[e]) {
      held[w].push_back(e);
      worker_load[w] += share[e];
    }
  }
  auto holds = [&](int w, int e) {
    return std::find(held[w].begin(), held[w].end(), e) != held[w].end();
  };
  for (;;) {
    const int a = static_cast<int>(std::max_element(worker_load.begin(), worker_load.end()) -
                                   worker_load.begin());
    const double top = worker_load[a];
    // The best change so far: moves e from a to b, and f (or none, -1) from b to a.
    double best_peak = top * (1 - 1e-12);
    int best_e = -1, best_b = -1, best_f = -1;
    for (int e : held[a]) {
      for (int b = 0; b < workers; ++b) {
        if (b == a || holds(b, e)) continue;
        if (static_cast<int>(held[b].size()) < worker_slots[b]) {
          double peak = std::max(top - share[e], worker_load[b] + share[e]);
          if (peak < best_peak) best_peak = peak, best_e = e, best_b = b, best_f = -1;
        }
        for (int f : held[b]) {
          if (share[f] >= share[e] || holds(a, f)) continue;
          double d = share[e] - share[f];
          double peak = std::max(top - d, worker_load[b] + d);
          if (peak < best_peak) best_peak = peak, best_e = e, best_b = b, best_f = f;
        }
      }
    }
    if (best_e < 0) break;
    auto move = [&](int e, int from, int to) {
      held[from].erase(std::find(held[from].begin(), held[from].end(), e));
      held[to].push_back(e);
      worker_load[from] -= share[e];
      worker_load[to] += share[e];
      std::replace((*hosts)[e].begin(), (*hosts)[e].end(), from, to);
    };
    move(best_e, a, best_b);
    if (best_f >= 0) move(best_f, best_b, a);
  }
}

// Steps 1-3 for one layer with `spare` slots beyond one per expert (at most the number of
// replicas the workers can take). Replicating into every spare slot is not always best when
// replicas are coarse next to a worker's load (two workers, 701 and 500 among five experts and one
// spare slot: halving 701 leaves 500 + 350.5 together), so spare, spare/2, spare/4, ..., 0 extra
// replicas are each tried and the lowest peak worker load is kept, the most replicas on ties.
std::vector<std::vector<int>> PlanLayer(const std::vector<double>& loads,
                                        const std::vector<int>& worker_slots, int64_t spare,
                                        int max_replicas) {
  std::vector<std::vector<int>> best;
  double best_peak = INFINITY;
  for (int64_t extra = spare;; extra /= 2) {
    std::vector<int> replicas = CountReplicas(loads, extra, max_replicas);
    std::vector<std::vector<int>> hosts = PackReplicas(loads, replicas, worker_slots);
    ImproveByMovesAndSwaps(loads, worker_slots, &hosts);
    std::vector<double> worker_load =
        WorkerLoads(hosts, loads, static_cast<int>(worker_slots.size()));
    double peak = *std::max_element(worker_load.begin(), worker_load.end());
    if (peak < best_peak) best_peak = peak, best = std::move(hosts);
    if (extra == 0) break;
  }
  for (std::vector<int>& h : best) std::sort(h.begin(), h.end());
  return best;
}

}  // namespace

absl::StatusOr<PlacementPlan> PlanExpertPlacement(const std::vector<std::vector<double>>& loads,
                                                  const std::vector<int>& worker_slots,
                                                  int64_t version) {
  if (loads.empty() || loads[0].empty()) {
    return absl::InvalidArgumentError("expert placement needs at least one layer and one expert");
  }
  const int n = static_cast<int>(loads[0].size());
  for (size_t l = 0; l < loads.size(); ++l) {
    if (static_cast<int>(loads[l].size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has loads for ",
                                                     loads[l].size(), " experts; layer 0 has ", n));
    }
    for (int e = 0; e < n; ++e) {
      if (!(loads[l][e] >= 0) || !std::isfinite(loads[l][e])) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, ", expert ", e, ": load ",
                                                       loads[l][e], " is not a finite load >= 0"));
      }
    }
  }
  K3_ASSIGN_OR_RETURN(const int64_t slots, TotalWorkerSlots(worker_slots));
  const int with_slots = static_cast<int>(
      std::count_if(worker_slots.begin(), worker_slots.end(), [](int s) { return s > 0; }));
  if (slots < n) {
    return absl::InvalidArgumentError(absl::StrCat(n, " experts need at least ", n, " slots; ",
                                                   worker_slots.size(), " workers have ", slots));
  }

  const int64_t spare = std::min<int64_t>(slots, static_cast<int64_t>(n) * with_slots) - n;
  PlacementPlan plan;
  plan.placement.version = version;
  plan.placement.num_workers = static_cast<int>(worker_slots.size());
  plan.placement.num_experts = n;
  for (size_t l = 0; l < loads.size(); ++l) {
    plan.placement.hosts.push_back(PlanLayer(loads[l], worker_slots, spare, with_slots));
    plan.worker_load.push_back(ExpectedWorkerLoad(plan.placement, static_cast<int>(l), loads[l]));
    plan.max_vio.push_back(WorkerMaxVio(plan.worker_load.back()));
  }
  return plan;
}

std::vector<double> ExpectedWorkerLoad(const ExpertPlacement& placement, int layer,
                                       absl::Span<const double> expert_loads) {
  return WorkerLoads(placement.hosts[layer], expert_loads, placement.num_workers);
}

double WorkerMaxVio(absl::Span<const double> worker_load) {
  if (worker_load.empty()) return 0.0;
  const double total = std::accumulate(worker_load.begin(), worker_load.end(), 0.0);
  if (total <= 0) return 0.0;
  const double mean = total / static_cast<double>(worker_load.size());
  return (*std::max_element(worker_load.begin(), worker_load.end()) - mean) / mean;
}

}  // namespace k3
