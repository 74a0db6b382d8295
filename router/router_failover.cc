// RouterCore's failover policy (router_core.h's file comment): which workers count as lost or
// only suspected, steps held for a new host of their experts and planned again, rows sent again
// to replicas after the expert deadline or a node's loss, and the readiness that follows. The
// data path (plan, dispatch, combine) is in router_core.cc.
#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "moe/moe_layer_map.h"
#include "moe/moe_wire.h"
#include "router/router_core.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

// How often held steps (router_core.h) are planned again without a new cluster state: a link that
// comes up changes no state.
constexpr absl::Duration kHeldRetry = absl::Milliseconds(100);

}  // namespace

void RouterCore::HoldOrFail(PeerId origin, uint64_t origin_step, absl::Time start,
                            MessageBytes request, PeerId node, const absl::Status& why) {
  // The coordinator's verdict on this node's death, which it may not have noticed yet (the
  // transport reports a dead process at once), or on the experts it already knows are lost.
  const auto unrecoverable = unrecoverable_losses_.find(static_cast<uint32_t>(node));
  const std::string& cause = unrecoverable != unrecoverable_losses_.end() ? unrecoverable->second
                                                                          : lost_experts_reason_;
  if (!cause.empty()) {
    FailHeld(origin, origin_step, start, request,
             absl::UnavailableError(absl::StrCat(
                 why.message(), "; the coordinator cannot move its experts: ", cause)));
    return;
  }
  if (absl::Now() - start >= options_.step_timeout) {
    FailHeld(origin, origin_step, start, request,
             absl::UnavailableError(absl::StrCat(why.message(), "; no live node took its experts "
                                                 "within ",
                                                 absl::FormatDuration(options_.step_timeout))));
    return;
  }
  if (held_.empty()) next_held_retry_ = absl::Now() + kHeldRetry;
  if (why.message() != holding_for_) {  // RetryHeld holds the same steps again every kHeldRetry
    holding_for_ = std::string(why.message());
    LOG(WARNING) << "holding steps whose rows need experts without a live host (" << holding_for_
                 << ") until the coordinator moves them";
  }
  held_.push_back(Held{origin, origin_step, start, std::move(request), node, why});
}

void RouterCore::RetryHeld() {
  next_held_retry_ = absl::Now() + kHeldRetry;
  std::vector<Held> held;
  held.swap(held_);
  for (Held& h : held) HandleMoeRequest(h.origin, std::move(h.request), h.start, /*held=*/true);
  if (!held.empty() && held_.empty()) {
    LOG(INFO) << held.size() << " held step(s) planned again under placement version "
              << placement_.version();
  }
  if (held_.empty()) holding_for_.clear();
}

void RouterCore::ExpireHeld(absl::Time now) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->start < options_.step_timeout) {
      ++it;
      continue;
    }
    HoldOrFail(it->origin, it->origin_step, it->start, std::move(it->request), it->node,
               it->why);
    it = held_.erase(it);
  }
  if (held_.empty()) holding_for_.clear();
}

std::string RouterCore::WorkerName(PeerId node) const {
  auto it = members_.find(static_cast<uint32_t>(node));
  if (it == members_.end()) return absl::StrCat("expert worker node ", node);
  const pb::NodeInfo& info = it->second.node();
  return absl::StrCat("expert worker node ", node, " (pid ", info.pid(), " on ",
                      info.host().empty() ? "?" : info.host(), ")");
}

absl::Status RouterCore::NodeStatus(PeerId node) const {
  auto member = members_.find(static_cast<uint32_t>(node));
  if (member == members_.end()) {
    return absl::UnavailableError(
        absl::StrCat(WorkerName(node), " lost: it is not a member of the cluster"));
  }
  if (member->second.state() == pb::LEFT) {
    return absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: it left the cluster"));
  }
  if (member->second.state() == pb::DEAD) {
    return absl::UnavailableError(absl::StrCat(
        WorkerName(node), " lost: the coordinator marked it DEAD (its heartbeats stopped)"));
  }
  if (auto suspect = suspects_.find(node); suspect != suspects_.end()) {
    return absl::UnavailableError(
        absl::StrCat(WorkerName(node), " lost: ", suspect->second.reason));
  }
  absl::Status link = links_->LinkStatus(node);
  if (link.ok()) return link;
  if (link.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: ", link.message()));
  }
  // This router's own problem (a new router whose links are still coming up): ABORTED tells the
  // attention worker to send the layer to another router
  // (attention_nodes/moe_client/remote_routed_moe.h).
  return absl::AbortedError(absl::StrCat(WorkerName(node),
                                         " is not connected to this router: ", link.message()));
}

bool RouterCore::OnlySuspected(PeerId node) const {
  if (suspects_.count(node) == 0) return false;
  auto member = members_.find(static_cast<uint32_t>(node));
  return member != members_.end() && member->second.state() != pb::LEFT &&
         member->second.state() != pb::DEAD && links_->LinkStatus(node).ok();
}

absl::Status RouterCore::WorkerStatus(int worker) const {
  return NodeStatus(placement_.worker_nodes[worker]);
}

void RouterCore::FailHeld(PeerId origin, uint64_t origin_step, absl::Time start,
                          std::string_view request, const absl::Status& status) {
  PendingStep step;
  step.origin = origin;
  step.origin_step = origin_step;
  step.start = start;
  step.dispatched = start;  // no compute: it waited for a live host of its experts
  MoeRequest header;
  absl::Span<const float> rows;
  if (options_.spans != nullptr && DecodeInPlace(request, &header, &rows).ok() &&
      !header.traces.empty()) {
    step.traces = std::move(header.traces);
    step.span_id = NewSpanId();
    step.model_layer = header.layer;
    step.step.tokens = header.tokens;
  }
  Fail(step, status);
}

void RouterCore::ExpireSteps(absl::Time now) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeExpired(now)) {
    const std::vector<PeerId> late = PendingSteps::Unanswered(*step);
    if (now < step->timeout_at) {
      // The expert deadline: the late workers are slow; their rows go to replicas where they can.
      // Rows without one keep waiting until the step timeout.
      std::vector<PeerId> slow;
      bool all_resent = true;
      for (PeerId node : late) {
        const bool resent = SendToReplicas(*step, node);
        all_resent = all_resent && resent;
        if (resent) slow.push_back(node);
      }
      step->resent = step->resent || !slow.empty();
      step->deadline = all_resent ? StepDeadline(now, step->timeout_at) : step->timeout_at;
      pending_.Add(std::move(step));
      for (PeerId node : slow) {
        if (slow_.insert(node).second) {
          LOG(WARNING) << WorkerName(node) << " did not answer a step within the expert deadline "
                       << "of " << absl::FormatDuration(expert_deadline_.deadline())
                       << "; its rows go to replicas until it answers again";
        }
        ResendWaitingOnSlow(node);
      }
      continue;
    }
    std::vector<std::string> messages;
    for (PeerId node : late) {
      auto member = members_.find(static_cast<uint32_t>(node));
      Suspect& suspect = suspects_[node];
      suspect.incarnation = member == members_.end() ? 0 : member->second.node().incarnation();
      suspect.reason = absl::StrCat("no answer to a step of layer ", step->model_layer, " within ",
                                    absl::FormatDuration(options_.step_timeout));
      LOG(WARNING) << WorkerName(node) << ": " << suspect.reason
                   << "; it counts as lost until it answers again";
      messages.push_back(std::string(NodeStatus(node).message()));
    }
    bool resent = true;
    for (PeerId node : late) resent = resent && SendToReplicas(*step, node);
    if (resent) {
      step->resent = true;
      step->timeout_at = now + options_.step_timeout;
      step->deadline = StepDeadline(now, step->timeout_at);
      pending_.Add(std::move(step));
    } else {
      Fail(*step, absl::UnavailableError(absl::StrJoin(messages, "; ")));
    }
    for (PeerId node : late) FailWaitingOn(node, NodeStatus(node));
  }
}

bool RouterCore::SendToReplicas(PendingStep& step, PeerId node) {
  if (step.requests.size() != step.nodes.size()) return false;
  absl::StatusOr<int> layer = MoeLayerIndex(config_, step.model_layer);
  if (!layer.ok() || !placement_.placed()) return false;
  const ExpertPlacement& placement = placement_.experts;
  auto usable = [&](int r) {
    const PeerId candidate = placement_.worker_nodes[r];
    return candidate != node && NodeStatus(candidate).ok() && slow_.count(candidate) == 0;
  };
  // Slots added by SplitToReplicas are not visited again here (they go to other nodes).
  const size_t slots = step.nodes.size();
  for (size_t w = 0; w < slots; ++w) {
    if (step.nodes[w] != node || step.answered[w]) continue;
    if (step.requests[w].empty()) return false;
    // A live worker holding every expert the slot's rows need: it computes the same partials.
    const std::vector<ExpertAssignment>& assignments = step.step.plan.workers[w].assignments;
    int target = -1;
    for (int r = 0; r < placement.num_workers && target < 0; ++r) {
      if (!usable(r)) continue;
      bool hosts_all = true;
      for (const ExpertAssignment& a : assignments) {
        const std::vector<int>& hosts = placement.WorkersFor(*layer, a.expert);
        if (!std::binary_search(hosts.begin(), hosts.end(), r)) {
          hosts_all = false;
          break;
        }
      }
      if (hosts_all) target = r;
    }
    if (target < 0) {
      // No one worker holds them all: split the rows over live hosts of each expert.
      if (!SplitToReplicas(step, w, *layer, usable)) return false;
      LOG_EVERY_N(WARNING, 20) << "step " << step.id << " of layer " << step.model_layer
                               << ": the rows for " << WorkerName(node)
                               << " went again to several replicas (every 20th logged)";
      continue;
    }
    const PeerId replica = placement_.worker_nodes[target];
    if (!transport_->Send(replica, step.requests[w]).ok()) return false;
    LOG_EVERY_N(WARNING, 20) << "step " << step.id << " of layer " << step.model_layer
                             << ": the rows for " << WorkerName(node) << " went again to "
                             << WorkerName(replica) << " (every 20th logged)";
    step.nodes[w] = replica;
    step.resent = true;
  }
  return true;
}

bool RouterCore::SplitToReplicas(PendingStep& step, size_t slot, int moe_layer,
                                 const std::function<bool(int)>& usable) {
  const ExpertPlacement& placement = placement_.experts;
  ExpertRequest original;
  if (!Decode(step.requests[slot], &original).ok()) return false;
  const WorkerDispatch& dispatch = step.step.plan.workers[slot];
  // Target worker -> the slot's assignments it takes: the first usable host of each expert.
  std::map<int, std::vector<ExpertAssignment>> by_target;
  for (const ExpertAssignment& a : dispatch.assignments) {
    const std::vector<int>& hosts = placement.WorkersFor(moe_layer, a.expert);
    auto host = std::find_if(hosts.begin(), hosts.end(), usable);
    if (host == hosts.end()) return false;
    by_target[*host].push_back(a);
  }
  const int64_t width = step.step.width;
  std::vector<std::pair<PeerId, std::string>> requests;
  std::vector<WorkerDispatch> dispatches;
  for (auto& [target, assignments] : by_target) {
    // The rows these assignments name, in the slot's order, renumbered.
    std::map<int32_t, int32_t> rows;  // slot row -> new row
    for (const ExpertAssignment& a : assignments) rows.emplace(a.row, 0);
    WorkerDispatch part;
    ExpertRequest request;
    // The new slots go after the existing ones, in this order.
    const size_t new_slot = step.nodes.size() + requests.size();
    if (new_slot >= kMaxSlots) return false;
    request.step_id = SlotRequestId(step.id, new_slot);
    request.layer = step.model_layer;
    request.placement_version = original.placement_version;
    request.width = original.width;
    request.traces = original.traces;
    for (auto& [row, renumbered] : rows) {
      renumbered = static_cast<int32_t>(part.tokens.size());
      part.tokens.push_back(dispatch.tokens[row]);
      request.rows.insert(request.rows.end(), original.rows.begin() + row * width,
                          original.rows.begin() + (row + 1) * width);
    }
    for (ExpertAssignment a : assignments) {
      a.row = rows[a.row];
      part.assignments.push_back(a);
    }
    request.rows_count = static_cast<int64_t>(part.tokens.size());
    request.assignments = part.assignments;
    requests.emplace_back(placement_.worker_nodes[target], Encode(request));
    dispatches.push_back(std::move(part));
  }
  // The slot answers nothing now; one new slot per target does.
  step.step.plan.workers[slot] = WorkerDispatch();
  step.answers[slot] = MessageBytes();
  step.answered[slot] = true;
  step.requests[slot].clear();
  --step.outstanding;
  step.resent = true;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PeerId target = requests[i].first;
    std::string bytes = requests[i].second;
    step.step.plan.workers.push_back(std::move(dispatches[i]));
    step.AddSlot();
    step.nodes.back() = target;
    step.requests.push_back(std::move(requests[i].second));
    ++step.outstanding;
    if (!transport_->Send(target, std::move(bytes)).ok()) return false;
  }
  return true;
}

void RouterCore::ResendWaitingOnSlow(PeerId node) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeWaitingOn(node)) {
    // Rows that find no replica stay with the node (SendToReplicas changes only resent slots).
    if (SendToReplicas(*step, node)) step->resent = true;
    pending_.Add(std::move(step));
  }
}

void RouterCore::FailWaitingOn(PeerId node, const absl::Status& status) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeWaitingOn(node)) {
    if (SendToReplicas(*step, node)) {
      step->resent = true;
      pending_.Add(std::move(step));
      continue;
    }
    // Answers to what the step sent elsewhere come for a step no longer pending: dropped.
    HoldOrFail(step->origin, step->origin_step, step->start, std::move(step->request), node,
               status);
  }
}

void RouterCore::UpdateReadiness() {
  absl::Status ready;
  if (!placement_problem_.empty()) {
    ready = absl::UnavailableError(placement_problem_);
  } else {
    // Ready while every expert has a live host (a dead worker's replicas take its rows).
    const ExpertPlacement& placement = placement_.experts;
    std::vector<absl::Status> workers;
    bool all_live = true;
    for (int w = 0; w < placement.num_workers; ++w) {
      workers.push_back(WorkerStatus(w));
      all_live = all_live && workers.back().ok();
    }
    for (int layer = 0; layer < placement.num_layers() && !all_live && ready.ok(); ++layer) {
      for (int e = 0; e < placement.num_experts && ready.ok(); ++e) {
        const std::vector<int>& hosts = placement.WorkersFor(layer, e);
        if (std::none_of(hosts.begin(), hosts.end(), [&](int h) { return workers[h].ok(); })) {
          ready = workers[hosts[0]];
        }
      }
    }
  }
  readiness_ = std::move(ready);
}

}  // namespace k3
