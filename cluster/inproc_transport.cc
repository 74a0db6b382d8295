#include "cluster/inproc_transport.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/inbox.h"

namespace k3 {
namespace {

constexpr char kAddressPrefix[] = "inproc:";

enum class LinkState { kUp, kClosed, kFailed };

struct Link {
  uint64_t token = 0;
  LinkState state = LinkState::kUp;
};

}  // namespace

struct InProcNetwork::Node {
  explicit Node(uint64_t t) : token(t) {}

  const uint64_t token;
  Inbox inbox;
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  bool killed ABSL_GUARDED_BY(mu) = false;
  std::map<PeerId, Link> peers ABSL_GUARDED_BY(mu);
  // Transports that connected to this one: they must hear when it goes away.
  std::set<uint64_t> known_by ABSL_GUARDED_BY(mu);

  // The transport `gone` left (gracefully or not); mark every link to it.
  void PeerGone(uint64_t gone, bool graceful) {
    std::vector<PeerId> ids;
    {
      absl::MutexLock lock(&mu);
      known_by.erase(gone);
      for (auto& [id, link] : peers) {
        if (link.token != gone || link.state != LinkState::kUp) continue;
        link.state = graceful ? LinkState::kClosed : LinkState::kFailed;
        ids.push_back(id);
      }
    }
    if (graceful) return;
    std::string names;
    for (PeerId id : ids) absl::StrAppend(&names, names.empty() ? "" : ",", id);
    inbox.Fail(gone, absl::UnavailableError(absl::StrCat("peer ", names, " (", kAddressPrefix, gone,
                                                         ") failed: process killed")));
  }
};

std::unique_ptr<InProcTransport> InProcNetwork::CreateTransport() {
  absl::MutexLock lock(&mu_);
  auto node = std::make_shared<Node>(next_token_++);
  nodes_[node->token] = node;
  return std::unique_ptr<InProcTransport>(new InProcTransport(this, std::move(node)));
}

std::shared_ptr<InProcNetwork::Node> InProcNetwork::Find(uint64_t token) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(token);
  return it == nodes_.end() ? nullptr : it->second;
}

void InProcNetwork::Remove(uint64_t token) {
  absl::MutexLock lock(&mu_);
  nodes_.erase(token);
}

InProcTransport::InProcTransport(InProcNetwork* network, std::shared_ptr<InProcNetwork::Node> node)
    : network_(network), node_(std::move(node)) {}

InProcTransport::~InProcTransport() { Close(); }

std::string InProcTransport::LocalAddress() const {
  return absl::StrCat(kAddressPrefix, node_->token);
}

absl::Status InProcTransport::Connect(PeerId peer, const std::string& address) {
  uint64_t token = 0;
  if (!absl::StartsWith(address, kAddressPrefix) ||
      !absl::SimpleAtoi(address.substr(sizeof(kAddressPrefix) - 1), &token)) {
    return absl::InvalidArgumentError(absl::StrCat("not an in-process address: '", address, "'"));
  }
  if (token == node_->token) {
    return absl::InvalidArgumentError("cannot connect a transport to itself");
  }
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return absl::FailedPreconditionError("transport closed");
    for (const auto& [id, link] : node_->peers) {
      if (link.state != LinkState::kUp) continue;
      if (id == peer && link.token == token) return absl::OkStatus();
      if (id == peer) {
        return absl::AlreadyExistsError(
            absl::StrCat("peer ", peer, " is bound to ", kAddressPrefix, link.token));
      }
      if (link.token == token) {
        return absl::AlreadyExistsError(absl::StrCat(address, " is bound to peer ", id));
      }
    }
  }
  std::shared_ptr<InProcNetwork::Node> remote = network_->Find(token);
  if (remote == nullptr || node_->inbox.Failed(token)) {
    return absl::UnavailableError(absl::StrCat("no transport at ", address));
  }
  {
    absl::MutexLock lock(&remote->mu);
    if (!remote->alive) return absl::UnavailableError(absl::StrCat("no transport at ", address));
    remote->known_by.insert(node_->token);
  }
  {
    absl::MutexLock lock(&node_->mu);
    node_->peers[peer] = Link{token, LinkState::kUp};
  }
  node_->inbox.Bind(token, peer);
  return absl::OkStatus();
}

void InProcTransport::Disconnect(PeerId peer) {
  uint64_t token = 0;
  {
    absl::MutexLock lock(&node_->mu);
    auto it = node_->peers.find(peer);
    if (it == node_->peers.end() || it->second.state != LinkState::kUp) return;
    it->second.state = LinkState::kClosed;
    token = it->second.token;
    node_->known_by.erase(token);
  }
  if (std::shared_ptr<InProcNetwork::Node> remote = network_->Find(token)) {
    remote->PeerGone(node_->token, /*graceful=*/true);
  }
}

absl::Status InProcTransport::Send(PeerId peer, std::string message) {
  uint64_t token = 0;
  {
    absl::MutexLock lock(&node_->mu);
    if (node_->killed) return absl::UnavailableError("transport killed");
    if (!node_->alive) return absl::FailedPreconditionError("transport closed");
    auto it = node_->peers.find(peer);
    if (it == node_->peers.end()) {
      return absl::NotFoundError(absl::StrCat("peer ", peer, " is not connected"));
    }
    switch (it->second.state) {
      case LinkState::kUp:
        break;
      case LinkState::kClosed:
        return absl::FailedPreconditionError(absl::StrCat("peer ", peer, " closed the link"));
      case LinkState::kFailed:
        return absl::UnavailableError(absl::StrCat("peer ", peer, " failed"));
    }
    token = it->second.token;
  }
  std::shared_ptr<InProcNetwork::Node> remote = network_->Find(token);
  if (remote == nullptr) {
    // The remote left; its departure has been (or is being) reported to this transport.
    return absl::UnavailableError(absl::StrCat("peer ", peer, " is gone"));
  }
  remote->inbox.Deliver(node_->token, std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<Received> InProcTransport::Receive(absl::Time deadline) {
  {
    absl::MutexLock lock(&node_->mu);
    if (node_->killed) return absl::UnavailableError("transport killed");
  }
  return node_->inbox.Receive(deadline);
}

void InProcTransport::Leave(bool graceful) {
  std::set<uint64_t> others;
  {
    absl::MutexLock lock(&node_->mu);
    if (!node_->alive) return;
    node_->alive = false;
    node_->killed = !graceful;
    others = node_->known_by;
    for (const auto& [id, link] : node_->peers) {
      if (link.state == LinkState::kUp) others.insert(link.token);
    }
  }
  for (uint64_t token : others) {
    if (std::shared_ptr<InProcNetwork::Node> remote = network_->Find(token)) {
      remote->PeerGone(node_->token, graceful);
    }
  }
  network_->Remove(node_->token);
  node_->inbox.Close();
}

void InProcTransport::Close() { Leave(/*graceful=*/true); }

void InProcTransport::Kill() { Leave(/*graceful=*/false); }

}  // namespace k3
