// The GPU data plane: expert-parallel all-to-all of device buffers over NCCL (2.28, CUDA 13), and
// point-to-point sends between two ranks (the device channels of cluster/nccl_device_channel.h).
//
// Not a Transport (transport.h): NCCL moves device memory in collective steps that every rank
// enters together, with no message boundaries or per-peer failure events. Its unit is AllToAllV:
// each rank sends a variable-size block to every rank (itself included) and learns the sizes it
// receives from a count exchange that precedes the data in the same call.
//
// Setup: one rank calls NewUniqueId() and ships the bytes to the others over the control plane;
// each rank then calls Create with them, its rank and the rank count. CreateLocal builds all ranks
// of a communicator inside one process (one GPU each), for single-host deployments and tests.
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
// Thread-safety: a communicator is used by one thread at a time. Ranks of a CreateLocal group are
// independent objects; a collective needs every rank to call it, so drive them from one thread
// each.
#ifndef K3SERVE_CLUSTER_NCCL_TRANSPORT_H_
#define K3SERVE_CLUSTER_NCCL_TRANSPORT_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3 {

class NcclTransport {
 public:
  struct Options {
    // Communicator creation (all ranks must join within it).
    absl::Duration init_timeout = absl::Seconds(60);
    // One AllToAllV (count exchange included), Send or Recv.
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
  // Every rank of a new communicator in this process: rank i on devices[i] (distinct devices).
  static absl::StatusOr<std::vector<std::unique_ptr<NcclTransport>>> CreateLocal(
      const std::vector<int>& devices, const Options& options);

  // Finalizes the communicator (waiting for its work, within op_timeout) or aborts it.
  ~NcclTransport();
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  // The collective exchange. `send` (device memory on this rank's device) holds send_bytes[r]
  // bytes for each rank r, back to back in rank order. The blocks from all ranks are written to
  // `recv` (device memory, `recv_capacity` bytes) back to back in source-rank order; the returned
  // vector holds their sizes. Runs on stream() and returns when the data is in place; `send` must
  // be ready when it is called (produce it on stream(), or synchronize). Errors: INVALID_ARGUMENT
  // (send_bytes has the wrong length, or the blocks to receive exceed recv_capacity),
  // DEADLINE_EXCEEDED (not done within op_timeout), UNAVAILABLE (NCCL or CUDA reported an error,
  // e.g. a peer died), FAILED_PRECONDITION (aborted earlier). All of them abort the communicator.
  absl::StatusOr<std::vector<size_t>> AllToAllV(const void* send,
                                                const std::vector<size_t>& send_bytes, void* recv,
                                                size_t recv_capacity);

  // Point to point: sends `bytes` bytes at `data` (device memory on this rank's device, ready when
  // called) to rank `peer`, or receives `bytes` bytes from `peer` into `data`. Each Send matches
  // the peer's next Recv of the same size (ncclSend/ncclRecv of ncclChar on stream()); returns
  // when the bytes left (Send) or are in place (Recv). Zero bytes: nothing happens on either side.
  // Errors as AllToAllV's (INVALID_ARGUMENT for a bad peer), all of them aborting the
  // communicator.
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
  // Stream, count buffers.
  absl::Status AllocateResources();
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
  // Counts of the exchange: sent and received (device), and their host copy (pinned).
  int64_t* send_counts_device_ = nullptr;
  int64_t* recv_counts_device_ = nullptr;
  int64_t* counts_host_ = nullptr;
  bool aborted_ = false;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NCCL_TRANSPORT_H_
