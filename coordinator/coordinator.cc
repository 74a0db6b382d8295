#include "coordinator/coordinator.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

CoordinatorState::CoordinatorState(const CoordinatorOptions& options, absl::Time start)
    : options_(options), recovery_end_(start + options.recovery_window), last_tick_(start) {
  const absl::Status valid = options_.Validate();
  CHECK(valid.ok()) << valid;
  Update(start);
}

absl::StatusOr<pb::RegisterResponse> CoordinatorState::Register(const pb::RegisterRequest& request,
                                                                absl::Time now) {
  const pb::NodeInfo& info = request.node();
  const pb::Role role = info.role();
  if (role != pb::ROLE_ATTENTION && role != pb::ROLE_ROUTER && role != pb::ROLE_EXPERT) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot register a node with role ", pb::Role_Name(role)));
  }
  if (info.grpc_address().empty()) {
    return absl::InvalidArgumentError("NodeInfo.grpc_address is empty");
  }
  if (info.incarnation() == 0) {
    return absl::InvalidArgumentError("NodeInfo.incarnation must be a nonzero random number");
  }
  if (info.expert_slots() < 0 || (role == pb::ROLE_EXPERT && info.expert_slots() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NodeInfo.expert_slots is ", info.expert_slots(), "; an expert node needs at least 1"));
  }

  uint32_t id = info.node_id();
  if (id == 0) {
    if (InRecovery(now)) {
      // Ids handed out now could collide with those of live nodes that have not re-registered
      // yet (see the file comment).
      return absl::UnavailableError(absl::StrCat(
          "coordinator is relearning its members for another ",
          absl::FormatDuration(recovery_end_ - now), "; retry then"));
    }
    id = next_id_;
  } else {
    auto it = members_.find(id);
    if (it == members_.end() && !InRecovery(now)) {
      // An id this process never handed out: the coordinator restarted under a running cluster.
      // Relearn it before acting on what is known so far (see the file comment).
      recovery_end_ = now + std::max(options_.recovery_window, options_.heartbeat_timeout);
      LOG(WARNING) << pb::Role_Name(role) << " node " << id << " (" << info.grpc_address()
                   << ") registers with an id this coordinator never assigned: it restarted; "
                   << "relearning the cluster from the nodes for "
                   << absl::FormatDuration(recovery_end_ - now);
    }
    if (it != members_.end()) {
      const Member& old = it->second;
      if (old.info.role() != role) {
        return absl::AlreadyExistsError(absl::StrCat("node id ", id, " is registered as ",
                                                     pb::Role_Name(old.info.role())));
      }
      if (old.info.incarnation() != info.incarnation() && old.state == pb::ALIVE) {
        return absl::AlreadyExistsError(absl::StrCat(
            "node id ", id, " belongs to a live process (pid ", old.info.pid(), " on ",
            old.info.host(), ", ", old.info.grpc_address(), "); register with node_id 0"));
      }
    }
  }
  next_id_ = std::max(next_id_, id + 1);

  Member& m = members_[id];
  const bool same_process = m.info.incarnation() == info.incarnation();
  m.info = info;
  m.info.set_node_id(id);
  m.state = pb::ALIVE;
  m.last_heartbeat = now;
  if (!same_process) {
    m.draining = false;  // a drain request was for the previous process
    m.registered = now;
  }
  ++members_version_;
  LOG(INFO) << "registered node " << id << " (" << pb::Role_Name(role) << ", "
            << info.grpc_address() << ", pid " << info.pid() << ")";

  MaybeAdoptPlacement(request.known_placement());
  Update(now);

  pb::RegisterResponse response;
  response.set_node_id(id);
  ClusterPlacementToProto(placement_, response.mutable_placement());
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  response.set_members_version(members_version_);
  return response;
}

HeartbeatReply CoordinatorState::Heartbeat(uint32_t node_id, uint64_t incarnation,
                                           const pb::LoadStats& load, absl::Time now,
                                           int64_t applied_placement_version,
                                           const std::vector<uint64_t>& broken_device_channels) {
  HeartbeatReply reply;
  auto it = members_.find(node_id);
  if (it == members_.end() || it->second.info.incarnation() != incarnation ||
      it->second.state == pb::LEFT) {
    reply.unknown_node = true;
  } else {
    Member& m = it->second;
    m.last_heartbeat = now;
    m.load = load;
    m.applied_placement_version = applied_placement_version;
    if (m.state == pb::DEAD) {
      LOG(INFO) << "node " << node_id << " is alive again";
      m.state = pb::ALIVE;
      ++members_version_;
      Update(now);
    }
    reply.drain = m.draining;
    std::set<uint64_t> broken;
    for (uint64_t id : broken_device_channels) {
      for (const IssuedDeviceChannel& c : device_channels_) {
        if (c.id == id && (c.sender == node_id || c.receiver == node_id)) broken.insert(id);
      }
    }
    if (!broken.empty() && !InRecovery(now)) {
      LOG(INFO) << "node " << node_id << " reports device channels " << absl::StrJoin(broken, ", ")
                << " broken; replacing them";
      PlanChannels(broken);
    }
  }
  reply.placement_version = placement_.version();
  reply.members_version = members_version_;
  reply.cluster_ready = ready();
  return reply;
}

absl::Status CoordinatorState::Leave(uint32_t node_id, uint64_t incarnation, absl::Time now) {
  auto it = members_.find(node_id);
  if (it == members_.end() || it->second.info.incarnation() != incarnation) {
    return absl::NotFoundError(absl::StrCat("no node ", node_id, " with that incarnation"));
  }
  if (it->second.state != pb::LEFT) {
    LOG(INFO) << "node " << node_id << " left";
    it->second.state = pb::LEFT;
    ++members_version_;
    Update(now);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::Drain(uint32_t node_id, absl::Time now) {
  auto it = members_.find(node_id);
  if (it == members_.end()) return absl::NotFoundError(absl::StrCat("no node ", node_id));
  if (absl::Status room = RoomToDrain(node_id); !room.ok()) {
    LOG(WARNING) << "drain of node " << node_id << " refused: " << room.message();
    return room;
  }
  if (!it->second.draining) {
    LOG(INFO) << "draining node " << node_id;
    it->second.draining = true;
    ++members_version_;
    Update(now);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::RoomToDrain(uint32_t node_id) const {
  const Member& member = members_.at(node_id);
  if (member.draining || member.info.role() != pb::ROLE_EXPERT || options_.num_experts == 0) {
    return absl::OkStatus();
  }
  // A cluster without a live router needs no experts (the launcher stops routers first).
  bool router = false;
  int slots = 0;  // per MoE layer, over the expert nodes that would be left
  for (const auto& [id, m] : members_) {
    if (m.state != pb::ALIVE) continue;
    router |= m.info.role() == pb::ROLE_ROUTER;
    if (id != node_id && Usable(id)) {
      slots += m.info.expert_slots() + std::max(0, options_.replica_slots_per_worker);
    }
  }
  if (!router || slots >= options_.num_experts) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "node ", node_id, " cannot drain: the other expert nodes offer ", slots,
      " slots per MoE layer for ", options_.num_experts,
      " experts; it keeps serving (add an expert node or give the nodes spare slots)"));
}

void CoordinatorState::Tick(absl::Time now) {
  // Ticks come every heartbeat_interval / 2. A much longer gap means this process did not run
  // (stopped, or starved of CPU): the heartbeats it could not read meanwhile prove nothing, and
  // counting them would declare every node DEAD at once when it runs again.
  const absl::Duration gap = now - last_tick_;
  last_tick_ = std::max(last_tick_, now);
  if (gap > options_.heartbeat_interval * 2) {
    LOG(WARNING) << "the coordinator did not run for " << absl::FormatDuration(gap)
                 << "; heartbeat deadlines move by as much";
    for (auto& [id, m] : members_) m.last_heartbeat = std::min(now, m.last_heartbeat + gap);
  }
  for (auto& [id, m] : members_) {
    if (m.state == pb::ALIVE && now - m.last_heartbeat > options_.heartbeat_timeout) {
      LOG(WARNING) << "node " << id << " (" << pb::Role_Name(m.info.role()) << ", "
                   << m.info.grpc_address() << ") missed heartbeats for "
                   << absl::FormatDuration(now - m.last_heartbeat) << ": DEAD";
      m.state = pb::DEAD;
      ++members_version_;
    }
  }
  Update(now);
}

pb::ClusterState CoordinatorState::State() const {
  pb::ClusterState state;
  for (const auto& [id, m] : members_) {
    pb::Member* out = state.add_members();
    *out->mutable_node() = m.info;
    out->set_state(m.state);
    out->set_last_heartbeat_unix_ms(absl::ToUnixMillis(m.last_heartbeat));
    out->set_draining(m.draining);
    *out->mutable_load() = m.load;
    out->set_applied_placement_version(m.applied_placement_version);
  }
  ClusterPlacementToProto(placement_, state.mutable_placement());
  state.set_ready(ready());
  state.set_not_ready_reason(not_ready_reason_);
  state.set_members_version(members_version_);
  state.set_recovering(recovering_);
  state.set_lost_experts_reason(lost_experts_reason_);
  state.mutable_unrecoverable_losses()->insert(unrecoverable_losses_.begin(),
                                               unrecoverable_losses_.end());
  for (const IssuedDeviceChannel& c : device_channels_) {
    pb::DeviceChannel* out = state.add_device_channels();
    out->set_id(c.id);
    out->set_sender(c.sender);
    out->set_receiver(c.receiver);
    out->set_nccl_unique_id(c.nccl_unique_id);
  }
  return state;
}

std::map<std::pair<pb::Role, pb::MemberState>, int> CoordinatorState::CountMembers() const {
  std::map<std::pair<pb::Role, pb::MemberState>, int> counts;
  for (const auto& [id, m] : members_) ++counts[{m.info.role(), m.state}];
  return counts;
}

bool CoordinatorState::Alive(uint32_t node_id) const {
  auto it = members_.find(node_id);
  return it != members_.end() && it->second.state == pb::ALIVE;
}

void CoordinatorState::MaybeAdoptPlacement(const pb::ExpertPlacement& proto) {
  if (proto.version() <= placement_.version()) return;
  absl::StatusOr<ClusterPlacement> placement = ClusterPlacementFromProto(proto);
  if (!placement.ok()) {
    LOG(WARNING) << "ignoring a node's placement: " << placement.status();
    return;
  }
  if (placement->experts.num_experts != options_.num_experts ||
      placement->experts.num_layers() != options_.num_moe_layers) {
    LOG(WARNING) << "ignoring a node's placement version " << proto.version() << ": it places "
                 << placement->experts.num_experts << " experts in "
                 << placement->experts.num_layers() << " layers, the model has "
                 << options_.num_experts << " in " << options_.num_moe_layers;
    return;
  }
  LOG(INFO) << "adopting placement version " << proto.version() << " from a registering node";
  placement_ = *std::move(placement);
  placement_error_.clear();
  // Ids in the placement may belong to nodes that have not re-registered yet.
  for (uint32_t node : placement_.worker_nodes) next_id_ = std::max(next_id_, node + 1);
}

void CoordinatorState::Update(absl::Time now) {
  if (options_.num_experts > 0 && !InRecovery(now)) {
    if (!placement_.placed()) {
      PlaceInitially();
    } else {
      ReplaceDeadWorkers();
    }
  }
  // A recovering coordinator lacks members that are alive: planning now would replace their
  // channels for nothing (the nodes ignore recovering states anyway).
  if (!InRecovery(now)) PlanChannels({});
  ComputeReadiness(now);
}

void CoordinatorState::PlanChannels(const std::set<uint64_t>& broken) {
  std::vector<DeviceChannelMember> alive;
  bool gpu_nodes = false;
  for (const auto& [id, m] : members_) {
    if (m.state != pb::ALIVE) continue;
    alive.push_back(
        DeviceChannelMember{m.info.role(), id, m.info.incarnation(), m.info.gpu_uuid()});
    gpu_nodes |= !m.info.gpu_uuid().empty();
  }
  if (!options_.nccl_unique_id_generator && gpu_nodes && !logged_no_channels_) {
    logged_no_channels_ = true;
    LOG(WARNING) << "nodes with a GPU data plane registered, but this coordinator has no NCCL "
                 << "(a build without the CUDA Toolkit): no device channels; their tiers talk "
                 << "through host memory";
  }
  DeviceChannelPlan plan = PlanDeviceChannels(alive, device_channels_, broken, next_channel_id_,
                                              options_.nccl_unique_id_generator);
  if (!plan.generator_error.ok() &&
      std::string(plan.generator_error.message()) != last_channel_error_) {
    last_channel_error_ = std::string(plan.generator_error.message());
    LOG(WARNING) << "no NCCL unique id for a device channel (retried at the next tick): "
                 << plan.generator_error;
  }
  next_channel_id_ = plan.next_id;
  if (!plan.changed) return;
  std::vector<uint64_t> ids;
  for (const IssuedDeviceChannel& c : plan.channels) ids.push_back(c.id);
  LOG(INFO) << "device channels now: [" << absl::StrJoin(ids, ", ") << "]";
  device_channels_ = std::move(plan.channels);
  ++members_version_;
}

void CoordinatorState::PlaceInitially() {
  std::vector<uint32_t> nodes;
  std::vector<int> slots;
  for (const auto& [id, m] : members_) {
    if (m.info.role() == pb::ROLE_EXPERT && m.state == pb::ALIVE && !m.draining &&
        static_cast<int>(nodes.size()) < options_.expected_expert_nodes) {
      nodes.push_back(id);
      slots.push_back(m.info.expert_slots());
    }
  }
  if (static_cast<int>(nodes.size()) < options_.expected_expert_nodes) return;
  absl::StatusOr<ExpertPlacement> experts =
      ContiguousPlacement(options_.num_moe_layers, options_.num_experts, slots, /*version=*/1);
  if (!experts.ok()) {
    if (placement_error_.empty()) LOG(ERROR) << "initial placement: " << experts.status();
    placement_error_ = std::string(experts.status().message());
    return;
  }
  AddRingReplicas(&*experts, options_.replica_slots_per_worker);
  placement_.experts = *std::move(experts);
  placement_.worker_nodes = nodes;
  placement_error_.clear();
  LOG(INFO) << "initial placement version 1 on expert nodes " << absl::StrJoin(nodes, ",")
            << (options_.replica_slots_per_worker > 0
                    ? absl::StrCat(", with up to ", options_.replica_slots_per_worker,
                                   " replicas per node and layer")
                    : "");
}

CoordinatorState::WorkerShare CoordinatorState::ShareOf(int worker) const {
  const ExpertPlacement& experts = placement_.experts;
  WorkerShare share;
  for (int layer = 0; layer < experts.num_layers(); ++layer) {
    const std::vector<int> hosted = experts.ExpertsOn(worker, layer);
    share.slots_needed = std::max(share.slots_needed, static_cast<int>(hosted.size()));
    for (int e : hosted) {
      const std::vector<int>& hosts = experts.WorkersFor(layer, e);
      share.sole_host |= std::none_of(hosts.begin(), hosts.end(), [&](int h) {
        return h != worker && Alive(placement_.worker_nodes[h]);
      });
    }
  }
  return share;
}

void CoordinatorState::ReplaceDeadWorkers() {
  const ExpertPlacement& experts = placement_.experts;
  std::set<uint32_t> used(placement_.worker_nodes.begin(), placement_.worker_nodes.end());
  bool changed = false;
  for (int w = 0; w < experts.num_workers; ++w) {
    const uint32_t node = placement_.worker_nodes[w];
    if (Alive(node)) continue;
    const WorkerShare share = ShareOf(w);
    // Also when every expert of w has another live replica: the spare restores the redundancy
    // (e.g. a killed expert node restarted under a new id), so that the next failure costs
    // nothing either.
    for (const auto& [id, m] : members_) {
      if (m.info.role() == pb::ROLE_EXPERT && m.state == pb::ALIVE && !m.draining &&
          used.count(id) == 0 &&
          m.info.expert_slots() + std::max(0, options_.replica_slots_per_worker) >=
              share.slots_needed) {
        LOG(WARNING) << "expert node " << node << " is gone; spare node " << id
                     << " takes over worker " << w
                     << (share.sole_host ? ""
                                         : " (its experts have live replicas: restoring them)");
        placement_.worker_nodes[w] = id;
        used.insert(id);
        changed = true;
        break;
      }
    }
  }
  if (changed) {
    placement_.experts.version = NextVersion();
    LOG(INFO) << "placement version " << placement_.version() << ": workers on nodes "
              << absl::StrJoin(placement_.worker_nodes, ",");
  }
}

int64_t CoordinatorState::NextVersion() {
  reserved_version_ = std::max(reserved_version_, placement_.version()) + 1;
  return reserved_version_;
}

absl::StatusOr<int64_t> CoordinatorState::ReservePlacementVersion(int64_t base_version) {
  if (!placement_.placed()) {
    return absl::FailedPreconditionError("the cluster has no expert placement yet");
  }
  if (placement_.version() != base_version) {
    return absl::FailedPreconditionError(absl::StrCat("the placement is at version ",
                                                      placement_.version(), ", not ",
                                                      base_version));
  }
  return NextVersion();
}

absl::Status CoordinatorState::CommitPlacement(const ClusterPlacement& placement,
                                               int64_t base_version, absl::Time now) {
  K3_RETURN_IF_ERROR(placement.Validate());
  if (!placement.placed() || placement.experts.num_experts != options_.num_experts ||
      placement.experts.num_layers() != options_.num_moe_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement version ", placement.version(), " places ", placement.experts.num_experts,
        " experts in ", placement.experts.num_layers(), " MoE layers; the model has ",
        options_.num_experts, " in ", options_.num_moe_layers));
  }
  if (placement.version() <= base_version || placement.version() > reserved_version_) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement version ", placement.version(), " was not reserved"));
  }
  if (placement_.version() != base_version) {
    return absl::AbortedError(absl::StrCat("the placement moved from version ", base_version,
                                           " to ", placement_.version(), " meanwhile"));
  }
  // The worker set may differ (a resize): the rollout had every node of it load its experts.
  for (uint32_t node : placement.worker_nodes) {
    if (!Usable(node)) {
      return absl::AbortedError(
          absl::StrCat("worker node ", node, " is not an alive, non-draining expert node"));
    }
  }
  LOG(INFO) << "placement version " << placement.version() << " places the experts on nodes "
            << absl::StrJoin(placement.worker_nodes, ",") << " (version " << placement_.version()
            << ": " << absl::StrJoin(placement_.worker_nodes, ",") << ")";
  placement_ = placement;
  Update(now);
  return absl::OkStatus();
}

bool CoordinatorState::Usable(uint32_t node_id) const {
  auto it = members_.find(node_id);
  return it != members_.end() && it->second.state == pb::ALIVE && !it->second.draining &&
         it->second.info.role() == pb::ROLE_EXPERT;
}

absl::StatusOr<ClusterPlacement> CoordinatorState::PlaceOn(
    const std::vector<uint32_t>& nodes) const {
  std::vector<int> slots;
  std::vector<int> with_replicas;
  int total = 0;
  for (uint32_t node : nodes) {
    const int declared = members_.at(node).info.expert_slots();
    slots.push_back(declared);
    with_replicas.push_back(declared + options_.replica_slots_per_worker);
    total += declared;
  }
  absl::StatusOr<ExpertPlacement> experts =
      ContiguousPlacement(options_.num_moe_layers, options_.num_experts, slots);
  if (experts.ok()) {
    AddRingReplicas(&*experts, options_.replica_slots_per_worker);
  } else if (options_.replica_slots_per_worker > 0) {
    // Fewer nodes than the cluster was sized for: their replica slots hold shares instead.
    experts = ContiguousPlacement(options_.num_moe_layers, options_.num_experts, with_replicas);
  }
  if (!experts.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the live expert nodes (", absl::StrJoin(nodes, ","), ") offer ", total,
        " slots per MoE layer",
        options_.replica_slots_per_worker > 0
            ? absl::StrCat(" (", total + options_.replica_slots_per_worker *
                                             static_cast<int>(nodes.size()),
                           " with replica slots)")
            : "",
        " for ", options_.num_experts, " experts"));
  }
  ClusterPlacement placement;
  placement.experts = *std::move(experts);
  placement.worker_nodes = nodes;
  return placement;
}

std::optional<CoordinatorState::Resize> CoordinatorState::PlanResize(absl::Time now) {
  if (options_.num_experts == 0 || !placement_.placed() || InRecovery(now)) return std::nullopt;
  const ExpertPlacement& experts = placement_.experts;
  std::vector<uint32_t> nodes;  // the new worker set: the usable workers in order, then joiners
  std::vector<std::string> why;
  for (int w = 0; w < experts.num_workers; ++w) {
    const uint32_t node = placement_.worker_nodes[w];
    if (Usable(node)) {
      nodes.push_back(node);
    } else if (Alive(node)) {
      why.push_back(absl::StrCat("node ", node, " drains"));
    } else {
      // A dead worker whose experts all have live replicas waits for a spare (ReplaceDeadWorkers);
      // one that was the last host of an expert leaves now. A resize drops both.
      bool last_host = false;
      for (int layer = 0; layer < experts.num_layers() && !last_host; ++layer) {
        for (int e : experts.ExpertsOn(w, layer)) {
          const std::vector<int>& hosts = experts.WorkersFor(layer, e);
          last_host |= std::none_of(hosts.begin(), hosts.end(),
                                    [&](int h) { return Alive(placement_.worker_nodes[h]); });
        }
      }
      if (last_host) {
        why.push_back(absl::StrCat("dead node ", node, " was the last host of experts"));
      }
    }
  }
  const absl::Duration join_delay = options_.heartbeat_timeout + options_.heartbeat_interval;
  const std::set<uint32_t> placed(placement_.worker_nodes.begin(), placement_.worker_nodes.end());
  for (const auto& [id, m] : members_) {
    if (Usable(id) && placed.count(id) == 0 && now - m.registered >= join_delay) {
      nodes.push_back(id);
      why.push_back(absl::StrCat("node ", id, " joins"));
    }
  }
  if (why.empty()) return std::nullopt;
  absl::StatusOr<ClusterPlacement> next =
      nodes.empty() ? absl::FailedPreconditionError("no alive, non-draining expert node is left")
                    : PlaceOn(nodes);
  if (!next.ok()) {
    const std::string problem =
        absl::StrCat(absl::StrJoin(why, ", "), ": ", next.status().message());
    if (problem != last_resize_problem_) {
      LOG(ERROR) << "cannot resize the expert placement: " << problem;
      last_resize_problem_ = problem;
    }
    return std::nullopt;
  }
  last_resize_problem_.clear();
  Resize resize;
  resize.placement = *std::move(next);
  resize.base_version = placement_.version();
  resize.why = absl::StrJoin(why, ", ");
  return resize;
}

void CoordinatorState::ResizeFailed(int64_t base_version, const absl::Status& status,
                                    absl::Time now) {
  resize_error_ = std::string(status.message());
  resize_error_version_ = base_version;
  ComputeReadiness(now);
}

void CoordinatorState::ComputeUnrecoverableLosses() {
  unrecoverable_losses_.clear();
  if (!placement_.placed()) return;
  const ExpertPlacement& experts = placement_.experts;
  const int replica_slots = std::max(0, options_.replica_slots_per_worker);
  int64_t slots = 0;                // of every usable expert node, placed or not
  int64_t slots_with_replicas = 0;  // the same plus their replica slots
  std::vector<int> spare_slots;     // of the usable nodes outside the placement
  const std::set<uint32_t> placed(placement_.worker_nodes.begin(), placement_.worker_nodes.end());
  for (const auto& [id, m] : members_) {
    if (!Usable(id)) continue;
    slots += m.info.expert_slots();
    slots_with_replicas += m.info.expert_slots() + replica_slots;
    if (placed.count(id) == 0) spare_slots.push_back(m.info.expert_slots() + replica_slots);
  }
  for (int w = 0; w < experts.num_workers; ++w) {
    const uint32_t node = placement_.worker_nodes[w];
    if (!Usable(node)) continue;
    // Would its death leave experts without a live host?
    const WorkerShare share = ShareOf(w);
    if (!share.sole_host) continue;
    // A spare would take its slot (ReplaceDeadWorkers), or the others its experts (PlanResize).
    if (std::any_of(spare_slots.begin(), spare_slots.end(),
                    [&](int s) { return s >= share.slots_needed; })) {
      continue;
    }
    const int own = members_.at(node).info.expert_slots();
    const int64_t others = slots - own;
    const int64_t others_with_replicas = slots_with_replicas - own - replica_slots;
    if (others >= options_.num_experts || others_with_replicas >= options_.num_experts) continue;
    unrecoverable_losses_[node] = absl::StrCat(
        "the other live expert nodes offer ", others, " slots per MoE layer",
        replica_slots > 0 ? absl::StrCat(" (", others_with_replicas, " with replica slots)") : "",
        " for ", options_.num_experts, " experts, and no spare is up");
  }
}

void CoordinatorState::ComputeReadiness(absl::Time now) {
  not_ready_reason_.clear();
  lost_experts_reason_.clear();
  ComputeUnrecoverableLosses();
  if (recovering_ && !InRecovery(now)) {
    LOG(INFO) << "relearned the cluster: " << members_.size() << " member(s), placement version "
              << placement_.version();
  }
  recovering_ = InRecovery(now);
  if (recovering_) {
    not_ready_reason_ = absl::StrCat("relearning members for another ",
                                     absl::FormatDuration(recovery_end_ - now));
    return;
  }
  for (pb::Role role : options_.required_roles) {
    const bool have = std::any_of(members_.begin(), members_.end(), [role](const auto& entry) {
      const Member& m = entry.second;
      return m.info.role() == role && m.state == pb::ALIVE && !m.draining;
    });
    if (!have) {
      not_ready_reason_ = absl::StrCat("no live, non-draining ", pb::Role_Name(role), " node");
      return;
    }
  }
  if (options_.num_experts == 0) return;
  if (!placement_.placed()) {
    if (!placement_error_.empty()) {
      not_ready_reason_ = absl::StrCat("cannot place the experts: ", placement_error_);
    } else {
      int alive = 0;
      for (const auto& [id, m] : members_) {
        alive += m.info.role() == pb::ROLE_EXPERT && m.state == pb::ALIVE && !m.draining;
      }
      not_ready_reason_ = absl::StrCat("waiting for expert nodes: ", alive, " of ",
                                       options_.expected_expert_nodes, " alive");
    }
    return;
  }
  const ExpertPlacement& experts = placement_.experts;
  std::vector<bool> worker_alive(experts.num_workers);
  for (int w = 0; w < experts.num_workers; ++w) {
    worker_alive[w] = Alive(placement_.worker_nodes[w]);
  }
  for (int layer = 0; layer < experts.num_layers(); ++layer) {
    for (int e = 0; e < experts.num_experts; ++e) {
      const std::vector<int>& hosts = experts.WorkersFor(layer, e);
      if (std::none_of(hosts.begin(), hosts.end(), [&](int w) { return worker_alive[w]; })) {
        // No spare took over (ReplaceDeadWorkers ran first): can a resize move it (PlanResize)?
        if (!resize_error_.empty() && resize_error_version_ == placement_.version()) {
          lost_experts_reason_ = absl::StrCat("moving its experts failed: ", resize_error_);
        } else {
          std::vector<uint32_t> usable;
          for (uint32_t node : placement_.worker_nodes) {
            if (Usable(node)) usable.push_back(node);
          }
          for (const auto& [id, m] : members_) {
            if (Usable(id) && std::find(placement_.worker_nodes.begin(),
                                        placement_.worker_nodes.end(),
                                        id) == placement_.worker_nodes.end()) {
              usable.push_back(id);
            }
          }
          if (usable.empty()) {
            lost_experts_reason_ = "no alive, non-draining expert node is left";
          } else if (absl::StatusOr<ClusterPlacement> p = PlaceOn(usable); !p.ok()) {
            lost_experts_reason_ = std::string(p.status().message());
          }
        }
        not_ready_reason_ = absl::StrCat(
            "expert ", e, " of MoE layer ", layer, " has no live host (worker ", hosts[0],
            " on node ", placement_.worker_nodes[hosts[0]], "); ",
            lost_experts_reason_.empty() ? "moving it onto the live expert nodes"
                                         : lost_experts_reason_);
        return;
      }
    }
  }
}

}  // namespace k3
