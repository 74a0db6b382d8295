// ClusterPlacement: an ExpertPlacement together with the expert node acting as each of its
// workers, and its conversion to and from the wire message k3serve.cluster.v1.ExpertPlacement.
//
// A plain value; not synchronized.
#ifndef K3SERVE_MOE_CLUSTER_PLACEMENT_H_
#define K3SERVE_MOE_CLUSTER_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moe/expert_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct ClusterPlacement {
  ExpertPlacement experts;             // experts.version 0: nothing placed yet
  std::vector<uint32_t> worker_nodes;  // worker index -> node id, experts.num_workers of them

  int64_t version() const { return experts.version; }
  bool placed() const { return experts.version > 0; }

  // OK for the unplaced value (version 0, nothing else set), or a placed one whose experts
  // validate and whose worker_nodes has one nonzero id per worker, without repeats.
  absl::Status Validate() const;

  bool operator==(const ClusterPlacement&) const = default;
};

void ClusterPlacementToProto(const ClusterPlacement& placement,
                             k3serve::cluster::v1::ExpertPlacement* proto);

// INVALID_ARGUMENT naming the problem when the message does not describe a valid placement.
absl::StatusOr<ClusterPlacement> ClusterPlacementFromProto(
    const k3serve::cluster::v1::ExpertPlacement& proto);

// ClusterPlacementFromProto, and also INVALID_ARGUMENT when the message does not place exactly
// the model's experts and MoE layers.
absl::StatusOr<ClusterPlacement> ClusterPlacementForModel(
    const k3serve::cluster::v1::ExpertPlacement& proto, int num_experts, int num_moe_layers);

}  // namespace k3

#endif  // K3SERVE_MOE_CLUSTER_PLACEMENT_H_
