// ExpertPlacement: which expert workers hold which routed experts, per MoE layer.
//
// Layers are counted among the MoE layers only: layer 0 is the first MoE layer (model layer
// first_k_dense_replace in K3). Each layer is placed on its own, so a worker may hold different
// experts in different layers. An expert held by several workers ("replicas") has its tokens split
// evenly between them by token index (WorkerForToken), the same choice on every router.
//
// A plain value: copy it, compare it, publish it under a new `version`. Not synchronized.
#ifndef K3SERVE_MOE_EXPERT_PLACEMENT_H_
#define K3SERVE_MOE_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {

struct ExpertPlacement {
  int64_t version = 0;  // increases with every new placement of a cluster
  int num_workers = 0;
  int num_experts = 0;  // routed experts per layer
  // hosts[layer][expert]: ascending ids of the workers holding a replica of the expert.
  std::vector<std::vector<std::vector<int>>> hosts;

  int num_layers() const { return static_cast<int>(hosts.size()); }

  // REQUIRES (for the three accessors): Validate().ok(), layer and expert / worker in range.
  const std::vector<int>& WorkersFor(int layer, int expert) const { return hosts[layer][expert]; }
  // The experts `worker` holds in `layer`, ascending.
  std::vector<int> ExpertsOn(int worker, int layer) const;
  // The replica serving `token` (any non-negative token index): hosts[layer][expert][token % n].
  int WorkerForToken(int layer, int expert, int64_t token) const {
    const std::vector<int>& h = hosts[layer][expert];
    return h[static_cast<size_t>(token % static_cast<int64_t>(h.size()))];
  }

  // OK when num_workers >= 1, num_experts >= 1, every layer lists num_experts experts, and every
  // expert has at least one host, hosts ascending without repeats, worker ids in [0, num_workers).
  absl::Status Validate() const;

  bool operator==(const ExpertPlacement&) const = default;
};

// The experts the workers can hold in all: the sum of `worker_slots`, one count a worker.
// InvalidArgument naming the first worker with a negative count. ContiguousPlacement and the
// coordinator's planner share it, so both refuse the same inputs with the same words.
absl::StatusOr<int64_t> TotalWorkerSlots(const std::vector<int>& worker_slots);

// The placement without replicas that a cluster starts from: workers take contiguous slices of the
// experts in worker order, each slice proportional to the worker's capacity (worker w starts at
// expert floor(N · C_<w / C), C the capacity total), the same slices in every layer. With
// capacities summing to N the slices are exactly the capacities: {1, 2, 3} for 6 experts gives
// {0}, {1, 2}, {3, 4, 5}. InvalidArgument unless capacities are >= 0 and sum to at least
// num_experts >= 1.
absl::StatusOr<ExpertPlacement> ContiguousPlacement(int num_layers, int num_experts,
                                                    const std::vector<int>& worker_capacity,
                                                    int64_t version = 0);

// Replicas for failover: in every layer, each worker w also takes up to `spare_per_worker`
// experts it does not hold yet, from the other workers' experts in ring order (worker w+1's
// first, then w+2's, ...; each worker's as they were before any were added). With
// spare_per_worker at least the largest worker's share, every expert gets a replica on another
// worker, and all experts of worker w+1 are also on worker w, so one live worker can take over a
// dead one's rows. A placement of one worker, or spare_per_worker <= 0, stays as it is.
// REQUIRES: placement->Validate().ok().
void AddRingReplicas(ExpertPlacement* placement, int spare_per_worker);

}  // namespace k3

#endif  // K3SERVE_MOE_EXPERT_PLACEMENT_H_
