// CoordinatorClient: a node's side of the membership protocol in proto/cluster.proto.
//
// One background thread registers (retrying with backoff while the coordinator is unreachable or
// relearning its members), heartbeats at the interval the coordinator asks for, registers again
// with the same id and the last placement it received when told "unknown node" (that is how a
// restarted coordinator relearns the cluster), fetches the cluster state whenever the membership
// or placement version moves, and says Leave on Stop. If its id was taken meanwhile it registers
// as a new node.
//
// Every RPC carries `rpc_timeout` as its deadline. A coordinator that stays unreachable does not
// stop the node: it keeps its last state and keeps trying (heartbeats at their interval; the
// channel reconnects with a backoff of 100 ms to 1 s). A state marked `recovering` (a restarted
// coordinator still relearning the cluster) is not taken: the node keeps its last state, so the
// callbacks never see the partial view, and fetches again with the next heartbeat.
//
// The background thread starts with Start, not with the constructor: a callback may run as soon as
// the thread does, so whatever the callbacks reach (the owner's pointer to this client included)
// must be in place first.
//
// Thread-safety: all methods may be called from any thread. Callbacks run on the client's thread,
// one at a time, between heartbeats: they must return quickly (a callback that blocks for the
// coordinator's heartbeat timeout gets this node declared DEAD; hand slow work such as transport
// Connects to another thread) and must not call Stop.
#ifndef K3SERVE_CLUSTER_COORDINATOR_CLIENT_H_
#define K3SERVE_CLUSTER_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/security.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct CoordinatorClientOptions {
  std::string coordinator_address;  // host:port
  ClientTls tls;                    // how to dial it (plaintext by default)
  // This node. node_id 0 asks for a new id; incarnation 0 picks a random one; pid and host are
  // filled in when unset. A node with a GPU data plane sets node.gpu_uuid (CudaGpuUuid in
  // cluster/nccl_device_channel.h) to be given device channels (cluster/device_channels.h).
  k3serve::cluster::v1::NodeInfo node;
  // Where the heartbeats take the ids of device channels that broke on this node from (e.g.
  // [&channels] { return channels.TakeBroken(); } for a DeviceChannels). Called on the client's
  // thread before each heartbeat; ids taken are sent with every heartbeat until one is answered
  // (then the coordinator has them). Null: none.
  std::function<std::vector<uint64_t>()> take_broken_device_channels;
  absl::Duration rpc_timeout = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(2);  // between failed registrations
};

struct CoordinatorCallbacks {
  // A new cluster state: after registering, and whenever members or placement changed.
  std::function<void(const k3serve::cluster::v1::ClusterState&)> on_cluster_state;
  // The coordinator asked this node to drain (called once per request).
  std::function<void()> on_drain;
};

class CoordinatorClient {
 public:
  // Does not contact the coordinator yet: see Start.
  CoordinatorClient(CoordinatorClientOptions options, CoordinatorCallbacks callbacks);
  // Stop().
  ~CoordinatorClient();

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  // Starts the background thread; registration happens there (see WaitRegistered). Callbacks
  // may run from now on. Call once.
  void Start();

  // This node's id once registered. DEADLINE_EXCEEDED if not registered by `deadline`.
  absl::StatusOr<uint32_t> WaitRegistered(absl::Time deadline);

  // Load reported with the following heartbeats.
  void SetLoad(const k3serve::cluster::v1::LoadStats& load);
  // The placement version this node acts on, reported with the heartbeats; a change is sent at
  // once (the coordinator waits for the routers' switch on it).
  void SetAppliedPlacementVersion(int64_t version);

  // Asks the coordinator to drain this node (Coordinator.Drain with its own id; e.g. an expert
  // node's experts move elsewhere first) and returns the cluster state fetched right after.
  // FAILED_PRECONDITION before registration; otherwise the RPCs' errors. Blocks for up to two
  // rpc_timeouts.
  absl::StatusOr<k3serve::cluster::v1::ClusterState> DrainSelf();

  // The last cluster state received (empty before the first).
  k3serve::cluster::v1::ClusterState cluster_state() const;
  uint64_t incarnation() const { return incarnation_; }

  // Stops heartbeating and tells the coordinator this node leaves (one attempt, rpc_timeout).
  // Idempotent; also fine without Start.
  void Stop();

 private:
  class Rpc;  // the gRPC stub, kept out of this header

  void Loop();
  bool Register();  // false: retry later
  void HeartbeatOnce();
  void FetchState();

  const CoordinatorClientOptions options_;
  const CoordinatorCallbacks callbacks_;
  const uint64_t incarnation_;
  std::unique_ptr<Rpc> rpc_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t node_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  k3serve::cluster::v1::LoadStats load_ ABSL_GUARDED_BY(mu_);
  int64_t applied_placement_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;  // a change to report before the interval
  k3serve::cluster::v1::ClusterState state_ ABSL_GUARDED_BY(mu_);

  // Client-thread only.
  absl::Duration heartbeat_interval_ = absl::Milliseconds(250);
  int64_t seen_placement_version_ = -1;
  uint64_t seen_members_version_ = 0;
  bool drain_reported_ = false;
  std::vector<uint64_t> unsent_broken_;  // taken broken channel ids no heartbeat delivered yet

  std::thread thread_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_COORDINATOR_CLIENT_H_
