// PeerLinks: keeps a process's data-plane Transport connected to the cluster members it talks to
// (a router: attention and expert nodes; an expert node: routers), following the coordinator's
// cluster state. The PeerId of a member is its node id.
//
// A background thread does the Connect calls, which may block for the transport's connect timeout,
// so that neither the coordinator client's thread (heartbeats) nor a receive loop ever waits on an
// unreachable peer. A target that is ALIVE is connected, and retried every `retry_interval` while
// Connect fails. A link whose peer failed (Transport kPeerFailed, reported with MarkFailed) stays
// failed: the transport never reconnects to a process it saw die, and a restarted process comes
// back with another address and incarnation (usually another node id), which is connected anew.
// Members that left or vanished from the state are disconnected.
//
// Thread-safety: all methods may be called from any thread.
#ifndef K3SERVE_CLUSTER_PEER_LINKS_H_
#define K3SERVE_CLUSTER_PEER_LINKS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/transport.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct PeerTarget {
  PeerId peer = 0;           // the member's node id
  uint64_t incarnation = 0;  // its process; a new one is connected anew
  std::string address;       // its Transport address
  bool alive = false;        // ALIVE in the cluster state: connect it (DEAD members are kept as is)
  std::string name;          // for messages, see NodeName
};

// "expert node 5 (pid 1234 on host-a)": how errors name a member.
std::string NodeName(const k3serve::cluster::v1::NodeInfo& node);

// The members of `state` with one of `roles`, except `self` and those that LEFT.
std::vector<PeerTarget> LinkTargets(const k3serve::cluster::v1::ClusterState& state,
                                    const std::set<k3serve::cluster::v1::Role>& roles,
                                    uint32_t self);

class PeerLinks {
 public:
  // `transport` must outlive this object.
  explicit PeerLinks(Transport* transport,
                     absl::Duration retry_interval = absl::Milliseconds(500));
  // Stop().
  ~PeerLinks();
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // Replaces the wanted peers. Acted on by the background thread.
  void SetTargets(std::vector<PeerTarget> targets);

  // The receive loop saw `peer` fail; `error` says why.
  void MarkFailed(PeerId peer, const absl::Status& error);

  // OK when `peer` is connected to its current target. Otherwise UNAVAILABLE with the failure that
  // MarkFailed reported (the process is lost), or FAILED_PRECONDITION when it is not connected
  // (yet): not a target, DEAD before it was reached, or the last Connect error.
  absl::Status LinkStatus(PeerId peer) const;

  // Grows whenever a link comes up, fails or goes away, so that users can re-check what they
  // derive from LinkStatus only when something changed.
  uint64_t version() const;

  // Waits until every ALIVE target is connected; false at `deadline`.
  bool WaitAllConnected(absl::Time deadline) const;

  // Ends the background thread; links stay as they are. Idempotent.
  void Stop();

 private:
  enum class State { kConnecting, kUp, kFailed };
  struct Link {
    PeerTarget target;
    State state = State::kConnecting;
    absl::Status status;          // why it is not up
    std::string bound_address;    // the address the transport binds this PeerId to; empty: none
    absl::Time next_attempt = absl::InfinitePast();
  };
  struct Action {
    PeerId peer = 0;
    std::string address;         // connect to this; empty: only disconnect
    bool disconnect_first = false;
  };

  void Loop();
  // Picks what to do now and when to look again.
  std::vector<Action> PlanLocked(absl::Time now, absl::Time* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllConnectedLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  Transport* const transport_;
  const absl::Duration retry_interval_;

  mutable absl::Mutex mu_;
  std::map<PeerId, Link> links_ ABSL_GUARDED_BY(mu_);
  // Peers the transport still binds (to this address) that are no longer wanted.
  std::map<PeerId, std::string> to_disconnect_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;             // something to look at
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_PEER_LINKS_H_
