#include "cluster/gpu_device_channels.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

#ifdef K3SERVE_CUDA
#include "cluster/nccl_device_channel.h"
#endif

namespace k3 {

absl::StatusOr<GpuChannelSetup> NcclChannelSetup(int cuda_device) {
#ifdef K3SERVE_CUDA
  GpuChannelSetup setup;
  K3_ASSIGN_OR_RETURN(setup.gpu_uuid, CudaGpuUuid(cuda_device));
  // NCCL tells devices apart by (host, GPU), the host by NCCL_HOSTID where it is set: processes
  // with their own NCCL_HOSTID may share a GPU in one communicator (over NCCL's network
  // transport), so the identity the coordinator compares includes it.
  if (const char* host = std::getenv("NCCL_HOSTID"); host != nullptr && *host != '\0') {
    absl::StrAppend(&setup.gpu_uuid, "@", host);
  }
  NcclTransport::Options options;
  options.op_timeout = kDeviceChannelOpTimeout;
  // An open waits for the peer to join; the opener thread opens nothing else meanwhile.
  options.init_timeout = absl::Seconds(20);
  setup.opener = [cuda_device, options](const DeviceChannelSpec& spec, bool as_sender) {
    return OpenNcclDeviceChannel(spec, as_sender, cuda_device, options);
  };
  return setup;
#else
  return absl::UnavailableError(absl::StrCat(
      "device channels on cuda:", cuda_device, ": this k3serve was built without the CUDA Toolkit"));
#endif
}

}  // namespace k3
