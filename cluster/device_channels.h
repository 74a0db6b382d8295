// DeviceChannels: a node's set of open device channels (cluster/device_channel.h), kept equal to
// what the coordinator's cluster state issues for this node.
//
// Lifecycle of a channel: the coordinator lists it in ClusterState.device_channels; Apply (called
// with each new cluster state) queues it; the opener thread opens it (for NCCL: joins the
// two-rank communicator, which blocks until the peer joins too); ToPeer/FromPeer then hand it
// out. When a Send or Recv on it fails, its user calls ReportBroken: the channel is aborted and
// dropped, and its id goes with the next heartbeat (TakeBroken, polled by the CoordinatorClient:
// CoordinatorClientOptions::take_broken_device_channels), after which the coordinator issues a
// replacement under a new id. A channel the state no longer lists (its peer died, left or
// restarted) is aborted and dropped by the next Apply.
//
// Opening order: the opener thread opens one channel at a time, lowest id first. Every node does
// the same, so two nodes never wait on each other's different channels: the lowest id that
// either of them still has to open is the next one for both. A channel that fails to open
// (e.g. the peer never joined within the opener's timeout) is logged and reported broken like a
// failed Send, so the coordinator reissues it.
//
// Ownership: this object owns the opener thread and its map of channels; ToPeer/FromPeer share
// a channel with their caller, whose reference keeps a dropped channel's object alive while it
// is in use (dropping aborts it, so the caller's pending and later calls fail fast).
//
// Thread-safety: every method may be called from any thread. Apply, ReportBroken, TakeBroken and
// the lookups never wait for an open; Apply and ReportBroken call Abort on the channels they drop
// (outside the lock), which returns once the channel's pending call, if any, has failed.
#ifndef K3SERVE_CLUSTER_DEVICE_CHANNELS_H_
#define K3SERVE_CLUSTER_DEVICE_CHANNELS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/device_channel.h"
#include "proto/cluster.pb.h"

namespace k3 {

class DeviceChannels {
 public:
  // Opens one channel (as its sender when `as_sender`, else as its receiver). Runs on the opener
  // thread only, one call at a time; may block until the peer joins (it should give up after a
  // timeout of its own: the thread opens nothing else meanwhile, and the destructor waits for it).
  using Opener = std::function<absl::StatusOr<std::unique_ptr<DeviceChannel>>(
      const DeviceChannelSpec& spec, bool as_sender)>;

  // Starts the opener thread ("k3-dev-channels").
  explicit DeviceChannels(Opener opener);
  // Aborts every channel, stops and joins the opener thread (after the open in progress, if any,
  // returned).
  ~DeviceChannels();
  DeviceChannels(const DeviceChannels&) = delete;
  DeviceChannels& operator=(const DeviceChannels&) = delete;

  // Opens (asynchronously) every channel of `state` with sender or receiver == self_node that it
  // does not have yet, and aborts and drops every one it has that the state no longer lists (a
  // channel listed again under the same id with another NCCL unique id counts as a new one: a
  // restarted coordinator reuses ids). Channels reported broken stay dropped while the state still
  // lists them. A state marked `recovering` is ignored (CoordinatorClient never delivers one).
  void Apply(const k3serve::cluster::v1::ClusterState& state, uint32_t self_node);

  // The open channel this node sends on to `peer` / receives on from `peer`; null when none is
  // open (not issued, still opening, failed, broken). With two open (a replacement opened while
  // the state still listed the old one) the newer, higher id.
  std::shared_ptr<DeviceChannel> ToPeer(uint32_t peer) const;
  std::shared_ptr<DeviceChannel> FromPeer(uint32_t peer) const;

  // After a failed Send/Recv: aborts and drops the channel, and remembers its id for the next
  // heartbeat. Unknown ids (already dropped) are ignored.
  void ReportBroken(uint64_t channel_id, const absl::Status& why);
  // The same for a channel known by the pointer ToPeer/FromPeer returned (its users do not see
  // ids). Ignored when it is no longer one of the channels held.
  void ReportBrokenChannel(const DeviceChannel* channel, const absl::Status& why);
  // Ids reported broken (or failed to open) since the last call, each once, ascending.
  std::vector<uint64_t> TakeBroken();

  // Ids of the open channels, ascending (tests, metrics).
  std::vector<uint64_t> OpenIds() const;

 private:
  enum class Phase { kPending, kOpening, kOpen, kBroken };
  struct Entry {
    DeviceChannelSpec spec;
    bool as_sender = false;
    Phase phase = Phase::kPending;
    std::shared_ptr<DeviceChannel> channel;  // set in kOpen only
  };

  void Run();
  // Marks `it` broken and queues its id; returns its channel for the caller to abort unlocked.
  std::shared_ptr<DeviceChannel> BreakLocked(std::map<uint64_t, Entry>::iterator it,
                                             const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<DeviceChannel> Find(bool sending, uint32_t peer) const;

  const Opener opener_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every channel of the last Apply that names this node, by id.
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> broken_ ABSL_GUARDED_BY(mu_);  // not yet taken by TakeBroken
  std::thread thread_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_DEVICE_CHANNELS_H_
