// UcxPeerTable: the remote processes a UcxTransport knows (each named by the token in its
// address, ucx_address.h), the PeerIds bound to them, and the state of each link; with the rules
// Connect and Send apply to that state (their errors are transport.h's).
//
// A remote is known from the first time either side connects; a PeerId is bound to it by our own
// Connect, which also creates the endpoint Send needs. A link the peer closed, or that we closed,
// may be bound again; a failed process never comes back (a restarted one has a new token).
//
// Ownership: the table owns every UcxRemote and keeps it as long as the table lives, at the same
// address, even after it failed or closed: UCX's endpoint callbacks and pending operations hold
// plain pointers to it. The endpoint (UcxRemote::ep) is the transport's: the table only records
// it, and the transport creates and closes it.
// Thread-safety: none. UcxTransport uses it under its own lock (the one every UCX call is made
// under), so UCX's callbacks may change the remotes they point at.
#ifndef K3SERVE_CLUSTER_UCX_PEER_TABLE_H_
#define K3SERVE_CLUSTER_UCX_PEER_TABLE_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/transport.h"

namespace k3 {

class UcxTransport;

struct UcxRemote {
  enum class State {
    kUp,       // usable (Send needs `ep` too: only our own Connect creates one)
    kClosing,  // we are closing it gracefully
    kClosed,   // closed gracefully, by either side
    kFailed,
  };

  // "peer 3 (10.0.0.2:4000)" once bound, else "process at 10.0.0.2": for error messages.
  std::string Describe() const;

  UcxTransport* transport = nullptr;  // the table's owner, for UCX's callbacks
  uint64_t token = 0;
  std::string where;  // ip:port, for messages
  bool bound = false;
  PeerId peer = 0;
  ucp_ep_h ep = nullptr;
  bool ep_errored = false;  // UCX reported an error: only a forced close is allowed
  State state = State::kUp;
  bool flush_pending = false;
  int acks_awaited = 0;
};

class UcxPeerTable {
 public:
  // `owner` is recorded in every remote (UcxRemote::transport).
  explicit UcxPeerTable(UcxTransport* owner) : owner_(owner) {}
  UcxPeerTable(const UcxPeerTable&) = delete;
  UcxPeerTable& operator=(const UcxPeerTable&) = delete;

  // The remote with `token`, or null when none was seen.
  UcxRemote* Find(uint64_t token) const;
  // The remote with `token`, added (kUp, unbound, no endpoint) when none was seen; *added says
  // which.
  UcxRemote& FindOrAdd(uint64_t token, bool* added = nullptr);
  // The remote `peer` was last bound to, whatever its state; null when `peer` never was.
  UcxRemote* Bound(PeerId peer) const;

  // Whether Connect may bind `peer` to the process `token` (`token_failed`: the Inbox saw it
  // fail). OK with *done when it already is, with a usable endpoint. ALREADY_EXISTS when `peer`
  // is bound to another process, or another PeerId to this one; UNAVAILABLE when the process
  // failed; FAILED_PRECONDITION while we close our link to it.
  absl::Status CheckBinding(PeerId peer, uint64_t token, bool token_failed, bool* done) const;
  // Binds `peer` to `remote` over the endpoint `ep` reaching it at `where` (the link is up again);
  // the remote `peer` was bound to before, if another, is unbound.
  void Bind(PeerId peer, UcxRemote& remote, ucp_ep_h ep, const std::string& where);

  // The remote Send may send to as `peer`. NOT_FOUND (never bound), UNAVAILABLE (failed),
  // FAILED_PRECONDITION (closed by either side, or closing, or the peer closed and our Connect
  // has not made a new endpoint yet).
  absl::StatusOr<UcxRemote*> ForSend(PeerId peer) const;

  // Every remote, and those in state kUp, in token order.
  std::vector<UcxRemote*> All() const;
  std::vector<UcxRemote*> Up() const;

 private:
  UcxTransport* const owner_;
  std::map<uint64_t, std::unique_ptr<UcxRemote>> remotes_;
  std::map<PeerId, UcxRemote*> peers_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_UCX_PEER_TABLE_H_
