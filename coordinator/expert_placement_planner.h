// Load-driven expert placement, after DeepSeek's EPLB: replicate the hottest experts into the spare
// slots, then pack the replicas onto workers so that the expected per-worker load evens out.
//
// Per layer, independently:
//  1. Replicas. Every expert gets one; each of `extra` more goes to the expert with the largest
//     load per replica (lower id on ties), never more replicas than workers with slots.
//  2. Packing. Replicas in descending order of load per replica (then expert id) each go to the
//     least loaded worker (then the one with fewer free slots, then lower id) that has a free slot
//     and does not already hold that expert. A replica that finds no such worker is dropped and its
//     expert's other replicas share its tokens; an expert's first replica always finds a slot.
//  3. Local search. While the most loaded worker can shed load by moving a replica to a worker
//     with a free slot or swapping it for a smaller one, the best such change is applied.
// Steps 1-3 run with extra = every spare slot, half of them, a quarter, ..., none; the plan with
// the lowest peak worker load wins (the most replicas on ties), so spare slots stay empty where a
// replica would not help. A replica serves an equal share of its expert's tokens
// (ExpertPlacement::WorkerForToken). Deterministic: equal inputs give equal plans.
#ifndef K3SERVE_COORDINATOR_EXPERT_PLACEMENT_PLANNER_H_
#define K3SERVE_COORDINATOR_EXPERT_PLACEMENT_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "moe/expert_placement.h"

namespace k3 {

struct PlacementPlan {
  ExpertPlacement placement;
  std::vector<std::vector<double>> worker_load;  // [layer][worker]: expected load, in load units
  std::vector<double> max_vio;                   // [layer]: WorkerMaxVio of worker_load[layer]
};

// loads[layer][expert]: tokens routed to each expert over a window (e.g. merged QB statistics).
// worker_slots[w]: how many experts worker w holds per layer (its own share plus spare slots).
// InvalidArgument for no layers, layers of different or zero width, a negative or non-finite
// load, a negative slot count, or fewer slots than experts.
absl::StatusOr<PlacementPlan> PlanExpertPlacement(const std::vector<std::vector<double>>& loads,
                                                  const std::vector<int>& worker_slots,
                                                  int64_t version);

// Expected load of each worker in `layer` when each expert's load splits evenly over its replicas.
// REQUIRES: placement.Validate().ok(), expert_loads.size() == placement.num_experts.
std::vector<double> ExpectedWorkerLoad(const ExpertPlacement& placement, int layer,
                                       absl::Span<const double> expert_loads);

// (max_w load_w − mean) / mean over all workers; 0 when the total load is 0.
double WorkerMaxVio(absl::Span<const double> worker_load);

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_EXPERT_PLACEMENT_PLANNER_H_
