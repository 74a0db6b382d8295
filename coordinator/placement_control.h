// PlacementControl: what the coordinator's balancing (LoadBalancer, PlacementRollout) needs from
// the coordinator's state. CoordinatorService provides it, carrying each call to the state's actor.
//
// Thread-safety: implementations take calls from any thread; each call with a deadline gives up
// with DEADLINE_EXCEEDED when the state does not answer by then.
#ifndef K3SERVE_COORDINATOR_PLACEMENT_CONTROL_H_
#define K3SERVE_COORDINATOR_PLACEMENT_CONTROL_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "moe/cluster_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {

class PlacementControl {
 public:
  virtual ~PlacementControl() = default;
  virtual absl::StatusOr<k3serve::cluster::v1::ClusterState> ClusterStateSnapshot(
      absl::Time deadline) = 0;
  // CoordinatorState::ReservePlacementVersion / CommitPlacement, with a deadline.
  virtual absl::StatusOr<int64_t> ReservePlacementVersion(int64_t base_version,
                                                          absl::Time deadline) = 0;
  virtual absl::Status CommitPlacement(const ClusterPlacement& placement, int64_t base_version,
                                       absl::Time deadline) = 0;
  // CoordinatorState::PlanResize / ResizeFailed, with a deadline.
  virtual absl::StatusOr<std::optional<CoordinatorState::Resize>> PlanResize(
      absl::Time deadline) = 0;
  virtual void ResizeFailed(int64_t base_version, const absl::Status& status) = 0;
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_PLACEMENT_CONTROL_H_
