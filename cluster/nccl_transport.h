// Point-to-point sends of device buffers over NCCL (2.28, CUDA 13) between the ranks of a
// communicator: the device channels' transport (cluster/nccl_device_channel.h, two ranks each).
//
// Not a Transport (transport.h): NCCL moves device memory in operations both ends enter, with no
// message boundaries or per-peer failure events; each Send must meet the peer's Recv of the same
// size.
//
// Setup: one rank calls NewUniqueId() and ships the bytes to the others over the control plane;
// each rank then calls Create with them, its rank and the rank count.
//
// Failure: communicators are non-blocking (ncclConfig_t.blocking = 0): every wait polls
// ncclCommGetAsyncError and the stream with a deadline, so a dead or stuck peer yields an error
// instead of a hang. Any error aborts the communicator (ncclCommAbort); after that every call fails
// with FAILED_PRECONDITION and the ranks must build a new communicator (the surviving ones, e.g.
// with a fresh unique id from the coordinator).
//
// Options::cancel lets another thread stop a wait: the waiting thread sees the flag within a poll
// interval, aborts the communicator itself and fails with FAILED_PRECONDITION.
//
// Thread-safety: a communicator is used by one thread at a time.
#ifndef K3SERVE_CLUSTER_NCCL_TRANSPORT_H_
#define K3SERVE_CLUSTER_NCCL_TRANSPORT_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3 {

class NcclTransport {
 public:
  struct Options {
    // Communicator creation (all ranks must join within it).
    absl::Duration init_timeout = absl::Seconds(60);
    // One Send or Recv.
    absl::Duration op_timeout = absl::Seconds(30);
    // When set (not owned; must outlive the communicator): every wait, communicator creation
    // included, stops once it reads true, aborts the communicator and fails with
    // FAILED_PRECONDITION, as do later calls.
    const std::atomic<bool>* cancel = nullptr;
  };

  // CUDA devices usable here; UNAVAILABLE when there is no driver or no GPU.
  static absl::StatusOr<int> DeviceCount();

  // A new communicator id (ncclGetUniqueId; works without a GPU), as bytes to ship to every rank.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins communicator `unique_id` as `rank` of `ranks`, on CUDA device `device`.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(const std::string& unique_id,
                                                               int rank, int ranks, int device,
                                                               const Options& options);

  // Finalizes the communicator (waiting for its work, within op_timeout) or aborts it.
  ~NcclTransport();
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  // Point to point: sends `bytes` bytes at `data` (device memory on this rank's device, ready when
  // called) to rank `peer`, or receives `bytes` bytes from `peer` into `data`. Each Send matches
  // the peer's next Recv of the same size (ncclSend/ncclRecv of ncclChar on stream()); returns
  // when the bytes left (Send) or are in place (Recv). Zero bytes: nothing happens on either side.
  // Errors: INVALID_ARGUMENT (a bad peer), DEADLINE_EXCEEDED (not done within op_timeout),
  // UNAVAILABLE (NCCL or CUDA reported an error, e.g. the peer died), FAILED_PRECONDITION
  // (aborted earlier); each aborts the communicator.
  absl::Status Send(const void* data, size_t bytes, int peer);
  absl::Status Recv(void* data, size_t bytes, int peer);

  // Aborts the communicator now (from this thread); pending and later calls fail.
  void Abort();

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  NcclTransport(int rank, int ranks, int device, const Options& options);
  // The stream the operations run on.
  absl::Status CreateStream();
  // Polls until the communicator has no operation in progress and the stream is idle.
  absl::Status Wait(absl::Time deadline, const char* what);
  // Send (send = true) or Recv.
  absl::Status PointToPoint(bool send, void* data, size_t bytes, int peer);
  // Aborts and returns `status` (with the communicator's state in its message).
  absl::Status Fail(absl::Status status);

  const int rank_;
  const int ranks_;
  const int device_;
  const Options options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NCCL_TRANSPORT_H_
