#include "cluster/peer_links.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

std::string NodeName(const pb::NodeInfo& node) {
  const char* role = "";
  switch (node.role()) {
    case pb::ROLE_ATTENTION:
      role = "attention ";
      break;
    case pb::ROLE_ROUTER:
      role = "router ";
      break;
    case pb::ROLE_EXPERT:
      role = "expert ";
      break;
    default:
      break;
  }
  return absl::StrCat(role, "node ", node.node_id(), " (pid ", node.pid(), " on ",
                      node.host().empty() ? "?" : node.host(), ")");
}

std::vector<PeerTarget> LinkTargets(const pb::ClusterState& state, const std::set<pb::Role>& roles,
                                    uint32_t self) {
  std::vector<PeerTarget> targets;
  for (const pb::Member& member : state.members()) {
    const pb::NodeInfo& node = member.node();
    if (node.node_id() == self || roles.count(node.role()) == 0 || member.state() == pb::LEFT ||
        node.transport_address().empty()) {
      continue;
    }
    PeerTarget target;
    target.peer = node.node_id();
    target.incarnation = node.incarnation();
    target.address = node.transport_address();
    target.alive = member.state() == pb::ALIVE;
    target.name = NodeName(node);
    targets.push_back(std::move(target));
  }
  return targets;
}

PeerLinks::PeerLinks(Transport* transport, absl::Duration retry_interval)
    : transport_(transport), retry_interval_(retry_interval) {
  thread_ = std::thread([this] { Loop(); });
}

PeerLinks::~PeerLinks() { Stop(); }

void PeerLinks::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  thread_.join();
}

void PeerLinks::SetTargets(std::vector<PeerTarget> targets) {
  absl::MutexLock lock(&mu_);
  std::map<PeerId, Link> next;
  for (PeerTarget& target : targets) {
    auto old = links_.find(target.peer);
    if (old != links_.end() && old->second.target.incarnation == target.incarnation &&
        old->second.target.address == target.address) {
      Link link = std::move(old->second);
      link.target = std::move(target);
      next.emplace(link.target.peer, std::move(link));
      continue;
    }
    Link link;
    link.status = absl::FailedPreconditionError("not connected yet");
    if (old != links_.end()) {
      link.bound_address = old->second.bound_address;
      if (old->second.state == State::kUp) ++version_;
    } else if (auto gone = to_disconnect_.find(target.peer); gone != to_disconnect_.end()) {
      // Back before the thread disconnected it: the connect attempt unbinds it first.
      link.bound_address = gone->second;
      to_disconnect_.erase(gone);
    }
    link.target = std::move(target);
    next.emplace(link.target.peer, std::move(link));
  }
  for (auto& [peer, link] : links_) {
    if (next.count(peer) > 0) continue;
    if (!link.bound_address.empty()) to_disconnect_[peer] = link.bound_address;
    if (link.state == State::kUp) ++version_;
  }
  links_ = std::move(next);
  dirty_ = true;
}

void PeerLinks::MarkFailed(PeerId peer, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(peer);
  if (it == links_.end() || it->second.state != State::kUp) return;
  LOG(WARNING) << it->second.target.name << " failed: " << error;
  it->second.state = State::kFailed;
  it->second.status = absl::UnavailableError(error.message());
  ++version_;
}

absl::Status PeerLinks::LinkStatus(PeerId peer) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(peer);
  if (it == links_.end()) {
    return absl::FailedPreconditionError("not a member of the cluster");
  }
  return it->second.state == State::kUp ? absl::OkStatus() : it->second.status;
}

uint64_t PeerLinks::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool PeerLinks::AllConnectedLocked() const {
  return std::all_of(links_.begin(), links_.end(), [](const auto& entry) {
    return !entry.second.target.alive || entry.second.state == State::kUp;
  });
}

bool PeerLinks::WaitAllConnected(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &PeerLinks::AllConnectedLocked), deadline);
}

std::vector<PeerLinks::Action> PeerLinks::PlanLocked(absl::Time now, absl::Time* wake) {
  std::vector<Action> actions;
  for (const auto& [peer, address] : to_disconnect_) actions.push_back(Action{peer, "", true});
  to_disconnect_.clear();
  *wake = absl::InfiniteFuture();
  for (auto& [peer, link] : links_) {
    if (link.state != State::kConnecting || !link.target.alive) continue;
    if (now < link.next_attempt) {
      *wake = std::min(*wake, link.next_attempt);
      continue;
    }
    actions.push_back(Action{peer, link.target.address,
                             !link.bound_address.empty() && link.bound_address != link.target.address});
    // Not planned again before the attempt's outcome is recorded (or the retry interval passed).
    link.next_attempt = now + retry_interval_;
    *wake = std::min(*wake, link.next_attempt);
  }
  return actions;
}

void PeerLinks::Loop() {
  absl::Time wake = absl::InfinitePast();
  for (;;) {
    std::vector<Action> actions;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || dirty_; };
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
      if (stopping_) return;
      dirty_ = false;
      actions = PlanLocked(absl::Now(), &wake);
    }
    for (const Action& action : actions) {
      if (action.disconnect_first) transport_->Disconnect(action.peer);
      if (action.address.empty()) continue;
      const absl::Status status = transport_->Connect(action.peer, action.address);
      absl::MutexLock lock(&mu_);
      auto it = links_.find(action.peer);
      const bool wanted = it != links_.end() && it->second.target.address == action.address &&
                          it->second.state == State::kConnecting;
      if (it == links_.end()) {
        // Dropped while connecting: undo.
        if (status.ok()) {
          to_disconnect_[action.peer] = action.address;
          dirty_ = true;
        }
        continue;
      }
      Link& link = it->second;
      if (action.disconnect_first) link.bound_address.clear();
      if (status.ok()) {
        link.bound_address = action.address;
        if (!wanted) {
          dirty_ = true;  // the target moved on meanwhile; the next plan rebinds it
          continue;
        }
        link.state = State::kUp;
        link.status = absl::OkStatus();
        ++version_;
        VLOG(1) << "connected " << link.target.name;
      } else if (wanted) {
        if (status.code() == absl::StatusCode::kAlreadyExists) {
          // The transport still binds this id to an earlier process: unbind it on the next try.
          link.bound_address = "(earlier binding)";
        }
        link.status =
            absl::FailedPreconditionError(absl::StrCat("cannot connect: ", status.message()));
        LOG(WARNING) << "cannot connect " << link.target.name << ": " << status;
      }
    }
  }
}

}  // namespace k3
