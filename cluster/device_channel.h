// DeviceChannel: a one-way, ordered channel of device-memory bytes from one process's GPU to
// another process's GPU (issue 21: the GPU tiers talk GPU to GPU).
//
// The coordinator issues channels in its cluster state (ClusterState.device_channels); each node
// opens the ones it is an end of through cluster/device_channels.h. The NCCL implementation is
// cluster/nccl_device_channel.h (CUDA builds only); this header needs no CUDA, so code that only
// holds channels builds everywhere.
//
// Thread-safety: Send (on the sending end) and Recv (on the receiving end) are called by one
// thread at a time; Abort may be called from any thread, also while a Send or Recv waits.
#ifndef K3SERVE_CLUSTER_DEVICE_CHANNEL_H_
#define K3SERVE_CLUSTER_DEVICE_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace k3 {

// One directed channel as the coordinator issued it (the wire form is
// k3serve.cluster.v1.DeviceChannel).
struct DeviceChannelSpec {
  uint64_t id = 0;             // unique for the coordinator's life; a replacement gets a new one
  uint32_t sender = 0;         // node id of the sending end (NCCL rank 0)
  uint32_t receiver = 0;       // node id of the receiving end (NCCL rank 1)
  std::string nccl_unique_id;  // ncclUniqueId bytes both ends join the communicator with
};

// A one-way, ordered channel of device-memory bytes from one process's GPU to another's.
class DeviceChannel {
 public:
  virtual ~DeviceChannel() = default;
  // Sends `bytes` bytes at device address `data` (already computed: the caller synchronized its
  // producer stream); returns once they left or with an error (UNAVAILABLE: peer or NCCL error,
  // DEADLINE_EXCEEDED, FAILED_PRECONDITION after Abort). Matches the receiver's Recvs in order,
  // one Recv of the same size per Send. After an error the channel is unusable: report it
  // (DeviceChannels::ReportBroken) and use the replacement the coordinator issues.
  virtual absl::Status Send(const void* data, size_t bytes) = 0;
  // Receives the next Send into `data` (device memory, exactly `bytes`); returns once it is in
  // place. Errors as Send's.
  virtual absl::Status Recv(void* data, size_t bytes) = 0;
  // Fails pending and later calls (any thread).
  virtual void Abort() = 0;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_DEVICE_CHANNEL_H_
