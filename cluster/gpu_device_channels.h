// What a node on CUDA device N needs to take part in device channels (cluster/device_channels.h):
// its GPU's identity for the coordinator (NodeInfo.gpu_uuid: nodes on one GPU get no channel
// between them; the UUID, and "@" and NCCL_HOSTID where that is set, since NCCL then takes the
// process for another host) and the opener of NCCL channels on that device
// (cluster/nccl_device_channel.h).
// A CUDA-free header, so that the nodes build the same with or without the CUDA Toolkit.
#ifndef K3SERVE_CLUSTER_GPU_DEVICE_CHANNELS_H_
#define K3SERVE_CLUSTER_GPU_DEVICE_CHANNELS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/device_channels.h"

namespace k3 {

struct GpuChannelSetup {
  std::string gpu_uuid;
  DeviceChannels::Opener opener;
};

// A channel's Send or Recv gives up after this long (the peer is dead or stuck); the layer then
// takes the router tier's path and the channel is replaced.
inline constexpr absl::Duration kDeviceChannelOpTimeout = absl::Seconds(5);

// Unavailable in a build without the CUDA Toolkit or without device `cuda_device`.
absl::StatusOr<GpuChannelSetup> NcclChannelSetup(int cuda_device);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_GPU_DEVICE_CHANNELS_H_
