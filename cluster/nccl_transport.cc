#include "cluster/nccl_transport.h"

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace k3 {
namespace {

// Between two looks at a pending operation: short against NCCL's latency, long enough not to burn
// a core that a CPU-side worker may need.
constexpr absl::Duration kPollInterval = absl::Microseconds(20);

absl::Status CudaError(const char* what, cudaError_t error) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status NcclError(const char* what, ncclResult_t result) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

bool Cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

absl::Status CancelledError(const char* what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": the NCCL communicator was aborted"));
}

// Waits until `comm` leaves ncclInProgress (a non-blocking call finished) or `deadline`, or until
// `cancel` (if set) reads true.
absl::Status AwaitComm(ncclComm_t comm, absl::Time deadline, const char* what,
                       const std::atomic<bool>* cancel = nullptr) {
  for (;;) {
    if (Cancelled(cancel)) return CancelledError(what);
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace

absl::StatusOr<int> NcclTransport::DeviceCount() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return CudaError("cudaGetDeviceCount", error);
  if (count == 0) return absl::UnavailableError("no CUDA device");
  return count;
}

absl::StatusOr<std::string> NcclTransport::NewUniqueId() {
  ncclUniqueId id;
  ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result);
  return std::string(id.internal, sizeof(id.internal));
}

NcclTransport::NcclTransport(int rank, int ranks, int device, const Options& options)
    : rank_(rank), ranks_(ranks), device_(device), options_(options) {}

absl::Status NcclTransport::CreateStream() {
  cudaError_t error = cudaSetDevice(device_);
  if (error == cudaSuccess) error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (error != cudaSuccess) {
    return CudaError(absl::StrCat("a stream on device ", device_).c_str(), error);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(const std::string& unique_id,
                                                                     int rank, int ranks,
                                                                     int device,
                                                                     const Options& options) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id of ", unique_id.size(),
                                                   " bytes, expected ", sizeof(ncclUniqueId)));
  }
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", ranks));
  }
  K3_ASSIGN_OR_RETURN(int devices, DeviceCount());
  if (device < 0 || device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " (", devices, " present)"));
  }
  std::unique_ptr<NcclTransport> transport(new NcclTransport(rank, ranks, device, options));
  absl::Status status = transport->CreateStream();
  if (!status.ok()) return status;
  ncclUniqueId id;
  memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NonBlockingConfig();
  ncclResult_t result = ncclCommInitRankConfig(&transport->comm_, ranks, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    transport->comm_ = nullptr;
    return NcclError("ncclCommInitRankConfig", result);
  }
  status = AwaitComm(transport->comm_, absl::Now() + options.init_timeout,
                     "joining the NCCL communicator", options.cancel);
  if (!status.ok()) return transport->Fail(status);
  return transport;
}

NcclTransport::~NcclTransport() {
  if (comm_ != nullptr && !aborted_) {
    cudaSetDevice(device_);
    ncclResult_t result = ncclCommFinalize(comm_);
    absl::Status status = result == ncclSuccess || result == ncclInProgress
                              ? AwaitComm(comm_, absl::Now() + options_.op_timeout, "finalize")
                              : NcclError("ncclCommFinalize", result);
    if (status.ok()) {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    } else {
      LOG(WARNING) << "NCCL rank " << rank_ << ": " << status << "; aborting";
      Abort();
    }
  }
  if (comm_ != nullptr) Abort();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclTransport::Abort() {
  aborted_ = true;
  if (comm_ == nullptr) return;
  cudaSetDevice(device_);
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclTransport::Fail(absl::Status status) {
  Abort();
  return status;
}

absl::Status NcclTransport::Wait(absl::Time deadline, const char* what) {
  for (;;) {
    if (Cancelled(options_.cancel)) return CancelledError(what);
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result);
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclError(absl::StrCat("rank ", rank_, ": ", what).c_str(), state);
    }
    if (state == ncclSuccess) {
      cudaError_t error = cudaStreamQuery(stream_);
      if (error == cudaSuccess) return absl::OkStatus();
      if (error != cudaErrorNotReady) {
        return CudaError(absl::StrCat("rank ", rank_, ": ", what).c_str(), error);
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, ": ", what, " did not finish within ",
                       absl::FormatDuration(options_.op_timeout), " (a peer is dead or stuck)"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status NcclTransport::Send(const void* data, size_t bytes, int peer) {
  // ncclSend takes a const pointer; PointToPoint only passes it on.
  return PointToPoint(/*send=*/true, const_cast<void*>(data), bytes, peer);
}

absl::Status NcclTransport::Recv(void* data, size_t bytes, int peer) {
  return PointToPoint(/*send=*/false, data, bytes, peer);
}

absl::Status NcclTransport::PointToPoint(bool send, void* data, size_t bytes, int peer) {
  const char* what = send ? "send" : "receive";
  if (aborted_) return absl::FailedPreconditionError("NCCL communicator was aborted");
  if (Cancelled(options_.cancel)) return Fail(CancelledError(what));
  if (peer < 0 || peer >= ranks_ || peer == rank_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": ", what, " with peer ", peer, " of ", ranks_, " ranks")));
  }
  if (bytes == 0) return absl::OkStatus();  // the peer skips its side too
  const absl::Time deadline = absl::Now() + options_.op_timeout;
  cudaSetDevice(device_);
  ncclResult_t result = send ? ncclSend(data, bytes, ncclChar, peer, comm_, stream_)
                             : ncclRecv(data, bytes, ncclChar, peer, comm_, stream_);
  if (result != ncclSuccess && result != ncclInProgress) {
    return Fail(NcclError(send ? "ncclSend" : "ncclRecv", result));
  }
  absl::Status status = Wait(deadline, what);
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

}  // namespace k3
