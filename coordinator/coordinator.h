// CoordinatorState: the coordinator's membership and placement state machine.
//
// Members register, heartbeat and leave; a member whose heartbeats stop for `heartbeat_timeout`
// is DEAD (a later heartbeat revives it). The expert placement is computed once the expected
// number of expert nodes is alive: contiguous slices of the expert ids over the lowest-id expert
// nodes, each slice proportional to the node's declared slots (ContiguousPlacement), plus, with
// `replica_slots_per_worker`, replicas of the next nodes' experts in that many extra slots of
// each node (AddRingReplicas), so that a router can send a dead node's rows to a live replica
// (router/router_core.h). Expert nodes
// beyond those are spares: when a placed node is dead or gone, the lowest-id spare with enough
// slots takes over its worker index (a new placement version; the spare loads the experts when it
// sees it), also when its experts have live replicas, which restores their redundancy.
//
// Elastic expert tier: the placement's worker set also grows and shrinks, always rolled out
// reserve -> load -> commit (ReservePlacementVersion, the nodes' LoadExperts, CommitPlacement;
// coordinator/coordinator_balancer.h runs it), so that no step is routed to a node before it
// holds its experts. PlanResize says when a new worker set is due and computes its placement
// (ContiguousPlacement over the new set's slots plus AddRingReplicas, as initially):
//  - join: an alive, non-draining expert node outside the placement that registered at least
//    heartbeat_timeout + heartbeat_interval ago joins it. The wait lets a restarted node take a
//    dead worker's slot as a spare first (that is immediate once the dead node is DEAD, and its
//    death is declared within that time);
//  - drain: a draining worker leaves it (it keeps serving older versions' steps meanwhile, and
//    exits once a placement without it is in force: expert_nodes/expert_node.h);
//  - repair: a dead worker hosting an expert with no other live host, when no spare can take
//    over, leaves it: the survivors load its experts from the checkpoint. When they cannot hold
//    every expert (too few slots, even counting the replica slots; or their LoadExperts failed:
//    ResizeFailed), lost_experts_reason() says why, and routers stop holding steps that need them.
//    Ahead of any death, unrecoverable_losses() names the live workers whose death could not be
//    repaired that way (nor by a spare), so that a router seeing one die fails at once rather than
//    waiting for the coordinator to notice.
// A resize drops every dead worker. Committing a placement needs every worker node alive, an
// expert node and not draining.
//
// Device channels (coordinator/device_channel_plan.h): GPU attention and expert nodes on different
// GPUs (NodeInfo.gpu_uuid) get NCCL point-to-point channels, one each way, published in the
// cluster state. They are planned again whenever membership may have changed (every Update) and
// when a heartbeat reports channels broken; any change bumps members_version, so the nodes fetch
// the new state. Without a unique-id generator (a build without NCCL) there are none.
//
// The cluster is ready when each required role has an alive, non-draining member and every
// expert of every MoE layer has a live host.
//
// Nothing here is persisted. A restarted coordinator rebuilds itself from the nodes: while it
// recovers it assigns no new ids and computes no placement; live nodes, told "unknown node" by
// their next heartbeat, register again with their old ids and their current placement, which is
// adopted when newer than what the coordinator has. It recovers during the first
// `recovery_window` after its start, and also (however that window was set, e.g. 0 for a fresh
// cluster) for `heartbeat_timeout` from the first registration of an id it never handed out: the
// sign that it restarted under a running cluster. Every live node re-registers within that time,
// since a node silent that long would be DEAD anyway. While it recovers, State() says
// `recovering`: its members and placement may lack live nodes, and nodes do not act on them.
//
// Time is an argument of every call, so tests drive it. Thread-safety: none; CoordinatorService
// confines an instance to one actor.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_H_
#define K3SERVE_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/device_channel_plan.h"
#include "moe/cluster_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct HeartbeatReply {
  bool unknown_node = false;
  int64_t placement_version = 0;
  uint64_t members_version = 0;
  bool drain = false;
  bool cluster_ready = false;
};

class CoordinatorState {
 public:
  // REQUIRES: options.Validate().ok(). `start` begins the recovery window.
  CoordinatorState(const CoordinatorOptions& options, absl::Time start);

  // Admits a node, or re-admits one that registers with its id. Errors: INVALID_ARGUMENT (bad
  // NodeInfo), UNAVAILABLE (a new node during the recovery window; retry later),
  // ALREADY_EXISTS (the id belongs to a live process or to another role).
  absl::StatusOr<k3serve::cluster::v1::RegisterResponse> Register(
      const k3serve::cluster::v1::RegisterRequest& request, absl::Time now);

  // Records a heartbeat. Never fails: an unknown node, a wrong incarnation or a node that left
  // gets unknown_node (register again).
  // `applied_placement_version`: the version the node reports acting on (0: none).
  // `broken_device_channels`: ids of device channels that failed on the node; those it is an end
  // of are replaced (reply.members_version then moves).
  HeartbeatReply Heartbeat(uint32_t node_id, uint64_t incarnation,
                           const k3serve::cluster::v1::LoadStats& load, absl::Time now,
                           int64_t applied_placement_version = 0,
                           const std::vector<uint64_t>& broken_device_channels = {});

  // Marks the node LEFT. NOT_FOUND for an unknown id or another incarnation.
  absl::Status Leave(uint32_t node_id, uint64_t incarnation, absl::Time now);

  // Asks a node to drain. NOT_FOUND for an unknown id; FAILED_PRECONDITION, and nothing changes,
  // when it is an expert node whose experts the other alive, non-draining expert nodes could not
  // hold (their declared plus replica slots per MoE layer fall short of the experts) while a
  // router is alive to need them: the node keeps serving rather than leave with the only copy.
  absl::Status Drain(uint32_t node_id, absl::Time now);

  // Declares members whose heartbeats stopped DEAD and repairs the placement. Call it at least
  // every heartbeat_interval / 2. A gap of more than 2 x heartbeat_interval since the last call
  // (the coordinator was stopped or starved) does not count against anyone's heartbeats.
  void Tick(absl::Time now);

  k3serve::cluster::v1::ClusterState State() const;

  bool ready() const { return not_ready_reason_.empty(); }
  // Relearning the cluster after a restart (see the file comment), as of the last call.
  bool recovering() const { return recovering_; }
  // Why the cluster is not ready; empty when it is.
  const std::string& not_ready_reason() const { return not_ready_reason_; }
  const ClusterPlacement& placement() const { return placement_; }
  // The device channels in force (ClusterState.device_channels), ascending id.
  const std::vector<IssuedDeviceChannel>& device_channels() const { return device_channels_; }
  uint64_t members_version() const { return members_version_; }
  // Members per (role, state), for metrics.
  std::map<std::pair<k3serve::cluster::v1::Role, k3serve::cluster::v1::MemberState>, int>
  CountMembers() const;

  // Why experts without a live host cannot be moved (see the file comment); empty otherwise.
  const std::string& lost_experts_reason() const { return lost_experts_reason_; }
  // For each live worker node whose death could not be repaired (ClusterState's
  // unrecoverable_losses), why.
  const std::map<uint32_t, std::string>& unrecoverable_losses() const {
    return unrecoverable_losses_;
  }

  // Rebalancing (coordinator/coordinator_balancer.h) rolls a placement out in two steps: it reserves
  // a version, has the expert nodes load that version's experts, then commits it. Any other
  // placement change meanwhile (a spare taking over a dead worker) gets a later version, so no
  // node ever sees two different placements under one number.
  //
  // The version after every placement and reservation so far. FAILED_PRECONDITION unless the
  // current placement has version `base_version`.
  absl::StatusOr<int64_t> ReservePlacementVersion(int64_t base_version);
  // Publishes `placement`, whose version must have been reserved. ABORTED when the placement is
  // no longer at `base_version` or one of its worker nodes is not an alive, non-draining expert
  // node; INVALID_ARGUMENT when `placement` does not validate or does not fit the model.
  absl::Status CommitPlacement(const ClusterPlacement& placement, int64_t base_version,
                               absl::Time now);

  // The worker-set change due now (see the file comment): the placement to roll out, with
  // version 0 (reserve one) and base_version the current placement's; nullopt when none is due
  // (also while recovering, and when the due change cannot be placed: that is logged, and for
  // lost experts it sets lost_experts_reason).
  struct Resize {
    ClusterPlacement placement;
    int64_t base_version = 0;
    std::string why;  // "node 5 joins", "node 3 drains", ... for the logs
  };
  std::optional<Resize> PlanResize(absl::Time now);
  // The rollout of a resize from `base_version` failed (e.g. a node could not load its experts):
  // while the placement stays at that version, lost experts are reported with this cause.
  void ResizeFailed(int64_t base_version, const absl::Status& status, absl::Time now);

 private:
  struct Member {
    k3serve::cluster::v1::NodeInfo info;
    k3serve::cluster::v1::MemberState state = k3serve::cluster::v1::ALIVE;
    absl::Time last_heartbeat;
    bool draining = false;
    k3serve::cluster::v1::LoadStats load;
    int64_t applied_placement_version = 0;  // its last heartbeat's
    absl::Time registered;  // this process's first registration (join waits from here)
  };

  bool Alive(uint32_t node_id) const;
  bool InRecovery(absl::Time now) const { return now < recovery_end_; }
  void MaybeAdoptPlacement(const k3serve::cluster::v1::ExpertPlacement& proto);
  // Computes the initial placement or hands dead workers' shares to spares, then readiness.
  void Update(absl::Time now);
  void PlaceInitially();
  // What worker `worker`'s share of the placement asks of a node that would take it over.
  struct WorkerShare {
    int slots_needed = 0;    // its most experts in one layer
    bool sole_host = false;  // some expert of it has no other live replica
  };
  WorkerShare ShareOf(int worker) const;
  void ReplaceDeadWorkers();
  void ComputeReadiness(absl::Time now);
  // Plans the device channels again (see the file comment) with `broken` ids dropped.
  void PlanChannels(const std::set<uint64_t>& broken);
  // An alive, non-draining expert node.
  bool Usable(uint32_t node_id) const;
  // OK when draining `node_id` loses no expert (see Drain).
  absl::Status RoomToDrain(uint32_t node_id) const;
  // unrecoverable_losses_ for the current members and placement.
  void ComputeUnrecoverableLosses();
  // The placement of experts over `nodes` (worker order), as initially: contiguous shares of
  // the declared slots plus ring replicas; with too few declared slots, shares of the slots plus
  // the replica slots, without replicas. Version 0.
  absl::StatusOr<ClusterPlacement> PlaceOn(const std::vector<uint32_t>& nodes) const;
  // The version for a new placement: above every version used or reserved.
  int64_t NextVersion();

  const CoordinatorOptions options_;
  absl::Time recovery_end_;
  bool recovering_ = false;  // InRecovery as of the last Update
  absl::Time last_tick_;     // see Tick: a long gap between ticks pauses the heartbeat clock
  std::map<uint32_t, Member> members_;  // by node id
  uint32_t next_id_ = 1;
  uint64_t members_version_ = 0;
  ClusterPlacement placement_;
  int64_t reserved_version_ = 0;  // the highest version handed out by ReservePlacementVersion
  std::string placement_error_;  // why the initial placement failed, if it did
  std::string lost_experts_reason_;
  std::map<uint32_t, std::string> unrecoverable_losses_;
  std::string resize_error_;        // why the last resize failed (see ResizeFailed)
  int64_t resize_error_version_ = 0;  // the base version it failed from
  std::string last_resize_problem_;   // logged once per distinct problem
  std::string not_ready_reason_ = "starting";
  std::vector<IssuedDeviceChannel> device_channels_;
  uint64_t next_channel_id_ = 1;
  bool logged_no_channels_ = false;  // GPU nodes seen without a generator (logged once)
  std::string last_channel_error_;   // the generator's last error, logged once per message
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_H_
