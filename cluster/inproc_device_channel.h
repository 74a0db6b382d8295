// Device channels (cluster/device_channel.h) whose two ends live in one process and whose "device
// memory" is host memory: for CPU tests of the code that moves rows on device channels (the
// expert worker's device rows, the GPU attention worker's remote experts) without GPUs or NCCL.
//
// InProcDeviceChannels::Opener() opens either end of a channel by its spec id; both ends of one id
// share a queue. Unlike NCCL, Send does not wait for the matching Recv (it copies the bytes into
// the queue); Recv waits for the next Send up to `recv_timeout` (DEADLINE_EXCEEDED), fails with
// INVALID_ARGUMENT when the sizes differ, and Abort on either end fails both ends' later calls and
// a waiting Recv with FAILED_PRECONDITION.
//
// Thread-safe; the registry must outlive the channels it opens.
#ifndef K3SERVE_CLUSTER_INPROC_DEVICE_CHANNEL_H_
#define K3SERVE_CLUSTER_INPROC_DEVICE_CHANNEL_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/device_channels.h"

namespace k3 {

class InProcDeviceChannels {
 public:
  explicit InProcDeviceChannels(absl::Duration recv_timeout = absl::Seconds(10))
      : recv_timeout_(recv_timeout) {}
  InProcDeviceChannels(const InProcDeviceChannels&) = delete;
  InProcDeviceChannels& operator=(const InProcDeviceChannels&) = delete;

  // Opens ends for DeviceChannels; never blocks.
  DeviceChannels::Opener Opener();

  struct Pipe;  // one channel id's shared queue

 private:
  std::shared_ptr<Pipe> PipeFor(uint64_t id);

  const absl::Duration recv_timeout_;
  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Pipe>> pipes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_INPROC_DEVICE_CHANNEL_H_
