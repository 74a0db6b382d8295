// PlacementRollout: how a new expert placement, whose version is reserved already, reaches the
// cluster without a step that finds its experts missing. Rebalancing and resizing the expert tier
// (coordinator/coordinator_balancer.h) both roll out this way:
//   1. LoadExperts(version, worker, experts) on every worker node of the new placement, all at
//      once; the nodes keep the experts older versions use. Any failure abandons the rollout
//      (nothing published);
//   2. commit the version (PlacementControl::CommitPlacement): routers learn it from the cluster
//      state and switch between steps; steps already planned finish on the old experts;
//   3. wait (up to switch_timeout) for every live router to report the new version (routers send
//      the version they use with their heartbeats, at once when it changes); RollOut returns
//      after step 2, and steps 3-4 run from the actor's timers;
//   4. after retire_delay, once every router reports the current version, LoadExperts with
//      retire_below_version lets the nodes drop experts only older versions needed (tried again
//      every retire_delay, 10 times at most, while a router lags).
//
// Thread-safety: not thread-safe; RollOut runs on `actor` (the balancer's), which continues it
// (its calls' answers are posted there) and schedules retirement on as well; nothing waits on
// the actor for a node's answer. `control`, `calls` and `actor` must outlive the rollout; stopping `calls`
// (RpcFanOut::Stop) ends waits and skips retirements.
#ifndef K3SERVE_COORDINATOR_PLACEMENT_ROLLOUT_H_
#define K3SERVE_COORDINATOR_PLACEMENT_ROLLOUT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/actor.h"
#include "coordinator/placement_control.h"
#include "coordinator/rpc_fan_out.h"
#include "moe/cluster_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct RolloutTimeouts {
  absl::Duration rpc_timeout = absl::Seconds(2);     // commit, routers' versions, snapshots
  absl::Duration load_timeout = absl::Seconds(60);   // LoadExperts
  absl::Duration switch_timeout = absl::Seconds(10);  // routers taking up the new placement
  absl::Duration retire_delay = absl::Seconds(5);     // then, before old experts may go
};

// The LoadExperts request that gives `worker` its experts of `placement` (every layer, in
// order), dropping those of versions below `retire_below` (0: drops nothing); `committed` is the
// version in force, which the node keeps even if its cluster state has not named it yet.
k3serve::cluster::v1::LoadExpertsRequest LoadExpertsRequestFor(const ClusterPlacement& placement,
                                                               int worker, int64_t retire_below,
                                                               int64_t committed);

class PlacementRollout {
 public:
  PlacementRollout(const RolloutTimeouts& timeouts, PlacementControl* control, RpcFanOut* calls,
                   Actor* actor)
      : timeouts_(timeouts), control_(control), calls_(calls), actor_(actor) {}

  // Steps 1-3 for `next` over `base_version` (its worker nodes' addresses from `state`), and
  // schedules step 4; `what` names it in errors. Returns at once: the LoadExperts calls end on
  // gRPC's threads and the rest runs on the actor, which then calls `done` with the outcome (OK
  // once committed; on another thread with UNAVAILABLE if the actor has stopped). Errors:
  // ABORTED when a worker node is not a member of `state` or stops being ALIVE (looked at every
  // 200 ms) while it loads, UNAVAILABLE naming the nodes whose LoadExperts failed, or the
  // commit's.
  void RollOut(const ClusterPlacement& next, int64_t base_version,
               const k3serve::cluster::v1::ClusterState& state, const std::string& what,
               std::function<void(absl::Status)> done);

 private:
  // A rollout's step 1 in flight. Actor only.
  struct Loading {
    bool finished = false;       // the answers are in
    std::string died;            // why it was given up, if it was
    std::function<void()> cancel;  // cancels the LoadExperts calls
  };
  // While `loading`, gives it up once one of `nodes` is not ALIVE (DEAD, LEFT or gone); looks
  // again every 200 ms.
  void WatchLoading(const std::shared_ptr<Loading>& loading, const std::vector<uint32_t>& nodes);
  // Steps 2 and 3 once step 1's answers are in.
  absl::Status Loaded(
      const ClusterPlacement& next, int64_t base_version, const std::string& what,
      const std::vector<absl::StatusOr<k3serve::cluster::v1::LoadExpertsResponse>>& loaded,
      const std::string& died);

  // Step 3: looks every kSwitchPoll (on the actor's timers) until every live router reports
  // `version` or `deadline` passes, then schedules step 4.
  void WatchSwitch(int64_t version, absl::Time deadline);
  // Whether every live router reported `version` or later with its heartbeats (the cluster
  // state's Member.applied_placement_version).
  bool RoutersUse(int64_t version);
  // Step 4 for the current placement; otherwise tries again after retire_delay, up to
  // attempts_left times.
  void Retire(int attempts_left);

  const RolloutTimeouts timeouts_;
  PlacementControl* const control_;
  RpcFanOut* const calls_;
  Actor* const actor_;
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_PLACEMENT_ROLLOUT_H_
