#include "cluster/ucx_peer_table.h"

#include "absl/strings/str_cat.h"

namespace k3 {

std::string UcxRemote::Describe() const {
  if (bound) return absl::StrCat("peer ", peer, " (", where, ")");
  return absl::StrCat("process at ", where);
}

UcxRemote* UcxPeerTable::Find(uint64_t token) const {
  auto it = remotes_.find(token);
  return it == remotes_.end() ? nullptr : it->second.get();
}

UcxRemote& UcxPeerTable::FindOrAdd(uint64_t token, bool* added) {
  std::unique_ptr<UcxRemote>& remote = remotes_[token];
  if (added != nullptr) *added = remote == nullptr;
  if (remote == nullptr) {
    remote = std::make_unique<UcxRemote>();
    remote->transport = owner_;
    remote->token = token;
  }
  return *remote;
}

UcxRemote* UcxPeerTable::Bound(PeerId peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? nullptr : it->second;
}

absl::Status UcxPeerTable::CheckBinding(PeerId peer, uint64_t token, bool token_failed,
                                        bool* done) const {
  *done = false;
  const UcxRemote* bound = Bound(peer);
  if (bound != nullptr && bound->state == UcxRemote::State::kUp && bound->ep != nullptr) {
    if (bound->token == token) {
      *done = true;
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(
        absl::StrCat("peer ", peer, " is already bound to ", bound->where));
  }
  for (const auto& [id, remote] : peers_) {
    if (id != peer && remote->token == token && remote->state == UcxRemote::State::kUp &&
        remote->ep != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat("that address is already bound to peer ", id));
    }
  }
  const UcxRemote* remote = Find(token);
  if (token_failed || (remote != nullptr && remote->state == UcxRemote::State::kFailed)) {
    return absl::UnavailableError("the process at that address failed");
  }
  if (remote != nullptr && remote->state == UcxRemote::State::kClosing) {
    return absl::FailedPreconditionError("that process is being disconnected");
  }
  return absl::OkStatus();
}

void UcxPeerTable::Bind(PeerId peer, UcxRemote& remote, ucp_ep_h ep, const std::string& where) {
  UcxRemote* previous = Bound(peer);
  if (previous != nullptr && previous != &remote) previous->bound = false;
  remote.where = where;
  remote.bound = true;
  remote.peer = peer;
  remote.ep = ep;
  remote.ep_errored = false;
  remote.state = UcxRemote::State::kUp;
  peers_[peer] = &remote;
}

absl::StatusOr<UcxRemote*> UcxPeerTable::ForSend(PeerId peer) const {
  UcxRemote* remote = Bound(peer);
  if (remote == nullptr) {
    return absl::NotFoundError(absl::StrCat("peer ", peer, " is not connected"));
  }
  switch (remote->state) {
    case UcxRemote::State::kFailed:
      return absl::UnavailableError(absl::StrCat(remote->Describe(), " failed"));
    case UcxRemote::State::kClosing:
    case UcxRemote::State::kClosed:
      return absl::FailedPreconditionError(absl::StrCat(remote->Describe(), " is closed"));
    case UcxRemote::State::kUp:
      break;
  }
  if (remote->ep == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(remote->Describe(), " closed the link; connect it again"));
  }
  return remote;
}

std::vector<UcxRemote*> UcxPeerTable::All() const {
  std::vector<UcxRemote*> all;
  for (const auto& [token, remote] : remotes_) all.push_back(remote.get());
  return all;
}

std::vector<UcxRemote*> UcxPeerTable::Up() const {
  std::vector<UcxRemote*> up;
  for (const auto& [token, remote] : remotes_) {
    if (remote->state == UcxRemote::State::kUp) up.push_back(remote.get());
  }
  return up;
}

}  // namespace k3
