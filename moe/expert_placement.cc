#include "moe/expert_placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {

std::vector<int> ExpertPlacement::ExpertsOn(int worker, int layer) const {
  std::vector<int> experts;
  const std::vector<std::vector<int>>& layer_hosts = hosts[layer];
  for (int e = 0; e < static_cast<int>(layer_hosts.size()); ++e) {
    for (int w : layer_hosts[e]) {
      if (w == worker) experts.push_back(e);
    }
  }
  return experts;
}

absl::Status ExpertPlacement::Validate() const {
  if (num_workers < 1 || num_experts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("placement v", version, " has ", num_workers,
                                                   " workers and ", num_experts,
                                                   " experts; both must be >= 1"));
  }
  for (int l = 0; l < num_layers(); ++l) {
    if (static_cast<int>(hosts[l].size()) != num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("placement v", version, ": layer ", l,
                                                     " lists ", hosts[l].size(), " experts, not ",
                                                     num_experts));
    }
    for (int e = 0; e < num_experts; ++e) {
      const std::vector<int>& h = hosts[l][e];
      if (h.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("placement v", version, ": expert ", e,
                                                       " of layer ", l, " has no worker"));
      }
      for (size_t i = 0; i < h.size(); ++i) {
        if (h[i] < 0 || h[i] >= num_workers) {
          return absl::InvalidArgumentError(absl::StrCat("placement v", version, ": expert ", e,
                                                         " of layer ", l, " is on worker ", h[i],
                                                         ", outside [0, ", num_workers, ")"));
        }
        if (i > 0 && h[i] <= h[i - 1]) {
          return absl::InvalidArgumentError(
              absl::StrCat("placement v", version, ": the workers of expert ", e, " of layer ", l,
                           " are not ascending and distinct"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TotalWorkerSlots(const std::vector<int>& worker_slots) {
  int64_t total = 0;
  for (size_t w = 0; w < worker_slots.size(); ++w) {
    if (worker_slots[w] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", w, " has a negative slot count ", worker_slots[w]));
    }
    total += worker_slots[w];
  }
  return total;
}

absl::StatusOr<ExpertPlacement> ContiguousPlacement(int num_layers, int num_experts,
                                                    const std::vector<int>& worker_capacity,
                                                    int64_t version) {
  K3_ASSIGN_OR_RETURN(const int64_t total, TotalWorkerSlots(worker_capacity));
  if (num_layers < 0 || num_experts < 1 || total < num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot place ", num_experts, " experts in ", num_layers, " layers on ",
                     worker_capacity.size(), " workers with ", total, " slots in all"));
  }
  ExpertPlacement placement;
  placement.version = version;
  placement.num_workers = static_cast<int>(worker_capacity.size());
  placement.num_experts = num_experts;
  std::vector<std::vector<int>> layer(num_experts);
  int64_t before = 0;  // capacity of the workers before w
  for (int w = 0; w < placement.num_workers; ++w) {
    // Slice sizes differ from N · cap / C by less than one, so they never exceed the capacity.
    int64_t first = num_experts * before / total;
    before += worker_capacity[w];
    int64_t end = num_experts * before / total;
    for (int64_t e = first; e < end; ++e) layer[e].push_back(w);
  }
  placement.hosts.assign(num_layers, layer);
  return placement;
}

void AddRingReplicas(ExpertPlacement* placement, int spare_per_worker) {
  const int n = placement->num_workers;
  if (n < 2 || spare_per_worker <= 0) return;
  for (int layer = 0; layer < placement->num_layers(); ++layer) {
    std::vector<std::vector<int>> held(n);  // before any replica was added
    for (int w = 0; w < n; ++w) held[w] = placement->ExpertsOn(w, layer);
    std::vector<std::vector<int>>& hosts = placement->hosts[layer];
    for (int w = 0; w < n; ++w) {
      int added = 0;
      for (int k = 1; k < n && added < spare_per_worker; ++k) {
        for (int e : held[(w + k) % n]) {
          if (added >= spare_per_worker) break;
          std::vector<int>& h = hosts[e];
          auto at = std::lower_bound(h.begin(), h.end(), w);
          if (at != h.end() && *at == w) continue;
          h.insert(at, w);
          ++added;
        }
      }
    }
  }
}

}  // namespace k3
