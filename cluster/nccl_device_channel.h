// The NCCL implementation of DeviceChannel (cluster/device_channel.h), built only with the CUDA
// Toolkit: each channel is a communicator of two ranks, the sender rank 0 and the receiver rank 1,
// joined with the coordinator's unique id (DeviceChannelSpec.nccl_unique_id) on this process's
// GPU. Use it as the DeviceChannels opener (cluster/device_channels.h):
//
//   DeviceChannels channels([device, options](const DeviceChannelSpec& spec, bool as_sender) {
//     return OpenNcclDeviceChannel(spec, as_sender, device, options);
//   });
//
// The two ends must be on different GPUs (NCCL refuses two ranks of one communicator on one
// device; the coordinator pairs nodes by NodeInfo.gpu_uuid, which CudaGpuUuid gives).
//
// Thread-safety: as DeviceChannel's. Abort from another thread sets a flag that the waiting call
// sees within NCCL's poll interval; the call aborts the communicator and fails with
// FAILED_PRECONDITION, and Abort returns once it has.
#ifndef K3SERVE_CLUSTER_NCCL_DEVICE_CHANNEL_H_
#define K3SERVE_CLUSTER_NCCL_DEVICE_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/device_channel.h"
#include "cluster/nccl_transport.h"

namespace k3 {

// Joins channel `spec` as its sender (rank 0) or receiver (rank 1) on CUDA device `cuda_device`.
// Blocks until the other end joined, within options.init_timeout (options.cancel is ignored: the
// channel has its own, for Abort). Each Send/Recv waits at most options.op_timeout.
absl::StatusOr<std::unique_ptr<DeviceChannel>> OpenNcclDeviceChannel(
    const DeviceChannelSpec& spec, bool as_sender, int cuda_device,
    const NcclTransport::Options& options);

// The UUID of CUDA device `cuda_device` as nvidia-smi prints it ("GPU-" and 32 hex digits in
// 8-4-4-4-12 groups), for NodeInfo.gpu_uuid. UNAVAILABLE without the device.
absl::StatusOr<std::string> CudaGpuUuid(int cuda_device);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NCCL_DEVICE_CHANNEL_H_
