// Which device channels (proto DeviceChannel, cluster/device_channel.h) the cluster should have:
// a pure function of the alive members, the channels issued so far and the ids reported broken,
// so CoordinatorState only calls it and publishes the result.
//
// Rule: every alive attention node and alive expert node that both have a GPU data plane
// (non-empty gpu_uuid) on DIFFERENT GPUs get two channels, attention -> expert and
// expert -> attention. NCCL refuses two ranks of one communicator on one device, so nodes that
// share a GPU keep staging through host memory. A channel is kept while both ends are alive with
// the incarnation they had when it was issued and nobody reported it broken; otherwise it is
// dropped and, if the pair still qualifies, replaced by a new channel: a new id (ids grow and are
// never reused) and a fresh NCCL unique id (a communicator's id cannot be joined twice).
#ifndef K3SERVE_COORDINATOR_DEVICE_CHANNEL_PLAN_H_
#define K3SERVE_COORDINATOR_DEVICE_CHANNEL_PLAN_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"

namespace k3 {

// A fresh NCCL unique id (NcclTransport::NewUniqueId in a CUDA build: cluster/nccl_unique_id.h).
using NcclUniqueIdGenerator = std::function<absl::StatusOr<std::string>()>;

// What the plan needs of an alive member.
struct DeviceChannelMember {
  k3serve::cluster::v1::Role role = k3serve::cluster::v1::ROLE_UNSPECIFIED;
  uint32_t node_id = 0;
  uint64_t incarnation = 0;
  std::string gpu_uuid;  // empty: no GPU data plane
};

// An issued channel and the incarnations of its ends when it was issued.
struct IssuedDeviceChannel {
  uint64_t id = 0;
  uint32_t sender = 0;
  uint32_t receiver = 0;
  std::string nccl_unique_id;
  uint64_t sender_incarnation = 0;
  uint64_t receiver_incarnation = 0;

  bool operator==(const IssuedDeviceChannel&) const = default;
};

struct DeviceChannelPlan {
  std::vector<IssuedDeviceChannel> channels;  // ascending id
  uint64_t next_id = 1;                       // for the next call
  bool changed = false;                       // channels differ from `current`
  // The generator failed for some pairs, which get no channel this time (a later call retries);
  // OK otherwise.
  absl::Status generator_error;
};

// The channels after `current` (ascending id) given the `alive` members, the ids in `broken`, and
// `next_id` (the lowest id not used yet). New ids are taken from next_id upward in order of
// (attention node id, expert node id), the attention -> expert channel first. A null `generator`
// (no NCCL in this build) issues nothing and drops everything.
DeviceChannelPlan PlanDeviceChannels(const std::vector<DeviceChannelMember>& alive,
                                     const std::vector<IssuedDeviceChannel>& current,
                                     const std::set<uint64_t>& broken, uint64_t next_id,
                                     const NcclUniqueIdGenerator& generator);

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_DEVICE_CHANNEL_PLAN_H_
