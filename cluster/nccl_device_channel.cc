#include "cluster/nccl_device_channel.h"

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

class NcclDeviceChannel : public DeviceChannel {
 public:
  NcclDeviceChannel(uint64_t id, bool as_sender) : id_(id), as_sender_(as_sender) {}

  // Joins the communicator (the constructor cannot: the transport's options point at cancel_).
  absl::Status Join(const DeviceChannelSpec& spec, int cuda_device,
                    NcclTransport::Options options) {
    options.cancel = &cancel_;
    K3_ASSIGN_OR_RETURN(transport_, NcclTransport::Create(spec.nccl_unique_id, as_sender_ ? 0 : 1,
                                                          /*ranks=*/2, cuda_device, options));
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, size_t bytes) override {
    if (!as_sender_) {
      return absl::FailedPreconditionError(
          absl::StrCat("device channel ", id_, ": Send on its receiving end"));
    }
    absl::MutexLock lock(&op_mu_);
    return Annotate(transport_->Send(data, bytes, /*peer=*/1));
  }

  absl::Status Recv(void* data, size_t bytes) override {
    if (as_sender_) {
      return absl::FailedPreconditionError(
          absl::StrCat("device channel ", id_, ": Recv on its sending end"));
    }
    absl::MutexLock lock(&op_mu_);
    return Annotate(transport_->Recv(data, bytes, /*peer=*/0));
  }

  void Abort() override {
    // The call in flight (if any) sees the flag, aborts the communicator on its own thread and
    // releases op_mu_: NcclTransport is used by one thread at a time.
    cancel_.store(true);
    absl::MutexLock lock(&op_mu_);
    transport_->Abort();
  }

 private:
  absl::Status Annotate(absl::Status status) const {
    if (status.ok()) return status;
    return absl::Status(status.code(),
                        absl::StrCat("device channel ", id_, ": ", status.message()));
  }

  const uint64_t id_;
  const bool as_sender_;
  std::atomic<bool> cancel_{false};  // outlives transport_ (declared first)
  absl::Mutex op_mu_;                // held by Send, Recv and Abort's use of transport_
  std::unique_ptr<NcclTransport> transport_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceChannel>> OpenNcclDeviceChannel(
    const DeviceChannelSpec& spec, bool as_sender, int cuda_device,
    const NcclTransport::Options& options) {
  auto channel = std::make_unique<NcclDeviceChannel>(spec.id, as_sender);
  absl::Status joined = channel->Join(spec, cuda_device, options);
  if (!joined.ok()) {
    return absl::Status(
        joined.code(), absl::StrCat("device channel ", spec.id, " (node ", spec.sender, " -> node ",
                                    spec.receiver, "): ", joined.message()));
  }
  return std::unique_ptr<DeviceChannel>(std::move(channel));
}

absl::StatusOr<std::string> CudaGpuUuid(int cuda_device) {
  cudaDeviceProp properties;
  const cudaError_t error = cudaGetDeviceProperties(&properties, cuda_device);
  if (error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", cuda_device, ": ", cudaGetErrorString(error)));
  }
  const auto* b = reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

}  // namespace k3
