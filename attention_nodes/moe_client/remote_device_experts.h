// RemoteDeviceExperts: a GPU attention worker's routed experts computed by GPU expert nodes that
// it reaches itself, GPU to GPU (issue 21), instead of through the router tier.
//
// Per MoE layer (Run, GpuModelRunner's DeviceExpertRunner contract): the attention worker's GPU
// has already computed the gate (ids and weights) and the latent rows z. Run copies the routing to
// the host, plans which expert node computes which pair (PlanExpertNodes: every node involved
// gets all rows), sends each node an ExpertRequest with rows_on_device over the data-plane
// Transport and then the rows on the device channel to it (cluster/device_channels.h), receives
// the ExpertResponses (rows_on_device) and each node's partial sums on the channel from it, and
// adds them into `out` on the device. The UCX control of failures stays as it is: a dead node is
// seen as a kPeerFailed event or a failed Send, and the coordinator's state drops its channels.
//
// Any failure (no placement, a needed node without open channels, a failed Send or Recv, an error
// answer, no answer within `timeout`) fails the layer with the cause, and the caller takes the
// router tier's path for it (GpuModelRunner does, when it has a RoutedMoe). Channels that failed
// are reported broken. To keep every channel in step with its peer, Run takes the partial sums of
// every node that answered OK even when the layer fails for another node.
//
// Sharing the Transport: the attention worker's RemoteRoutedMoe also receives on it. Run receives
// only while it waits for its own answers, when no routed layer is in flight (GpuModelRunner runs
// one layer at a time), and hands every event that is not its own to `others` (in the attention
// server: RemoteRoutedMoe::Deliver, which drops stale answers and acts on router failures).
//
// Thread-safety: Run from one thread at a time (the stepping thread); SetPlacement from any.
#ifndef K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_DEVICE_EXPERTS_H_
#define K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_DEVICE_EXPERTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/device_channels.h"
#include "cluster/transport.h"
#include "model/config.h"
#include "moe/cluster_placement.h"

namespace k3 {

// The device memory operations Run needs, on the caller's stream: CUDA on a GPU
// (attention_nodes/cuda/cuda_row_ops.h), plain host memory in CPU tests.
class DeviceRowOps {
 public:
  virtual ~DeviceRowOps() = default;
  // Copies `bytes` from device to host once the stream's earlier work is done; returns when done.
  virtual absl::Status CopyToHost(const void* device, void* host, size_t bytes, void* stream) = 0;
  // Waits for the stream's work (the rows must be computed before a channel sends them).
  virtual absl::Status Synchronize(void* stream) = 0;
  // out[0, n) = 0, enqueued on the stream.
  virtual absl::Status Zero(float* out, int64_t n, void* stream) = 0;
  // out[0, n) += x[0, n), enqueued on the stream.
  virtual absl::Status Add(const float* x, float* out, int64_t n, void* stream) = 0;
  // Device scratch of at least `floats` floats, owned by this object; `index` picks one of
  // several (one per node answering a layer), each valid until the next call with that index.
  virtual absl::StatusOr<float*> Scratch(int index, int64_t floats) = 0;
};

struct RemoteDeviceExpertsOptions {
  // How long Run waits for the answers of a layer.
  absl::Duration timeout = absl::Seconds(5);
  // Receives the Transport's events that are not Run's own (see the file comment); may be null.
  std::function<void(Received)> others;
};

class RemoteDeviceExperts {
 public:
  // Borrowed: all must outlive this object. `transport` must be linked to the expert nodes
  // (PeerId = node id).
  RemoteDeviceExperts(Transport* transport, DeviceChannels* channels, const ModelConfig& config,
                      RemoteDeviceExpertsOptions options = RemoteDeviceExpertsOptions());
  RemoteDeviceExperts(const RemoteDeviceExperts&) = delete;
  RemoteDeviceExperts& operator=(const RemoteDeviceExperts&) = delete;

  // The placement of the cluster state in force. Any thread.
  void SetPlacement(ClusterPlacement placement);

  // GpuModelRunner's DeviceExpertRunner, with the device memory operations of `ops` (the
  // runner's): model layer `layer`, z [rows, width] and out [rows, width] fp32 in device memory,
  // the gate's ids and weights [rows, top_k] in device memory, all on `stream`. Returns with out
  // written (enqueued on the stream) or the layer's failure (see the file comment).
  absl::Status Run(DeviceRowOps& ops, int layer, const float* z, int64_t rows, int64_t width,
                   const int32_t* ids, const float* weights, int32_t top_k, float* out,
                   void* stream);

  // Layers served, and failed after their requests left (the caller took another path), since
  // start; a layer refused before sending anything (no channels, no placement) counts as neither.
  // Any thread.
  int64_t layers_served() const { return layers_served_.load(std::memory_order_relaxed); }
  int64_t layers_failed() const { return layers_failed_.load(std::memory_order_relaxed); }

 private:
  // One node's share of a layer in flight.
  struct Pending {
    uint32_t node = 0;
    uint64_t step_id = 0;
    std::shared_ptr<DeviceChannel> rows_out;  // the channel to the node
    std::shared_ptr<DeviceChannel> answers;   // the channel from the node
    bool answered = false;
  };

  // *sent_any: whether a request left (the layer was tried, not just unavailable).
  absl::Status RunLayer(DeviceRowOps& ops, int layer, const float* z, int64_t rows, int64_t width,
                        const int32_t* ids, const float* weights, int32_t top_k, float* out,
                        void* stream, bool* sent_any);
  // Receives until every pending node answered or the deadline passed; adds the partial sums into
  // out. The first failure, after taking every OK answer's sums.
  absl::Status Collect(DeviceRowOps& ops, std::vector<Pending>& pending, int64_t rows,
                       int64_t width, float* out, void* stream, absl::Time deadline);
  // Applies one ExpertResponse to `pending`; false when it is not one of theirs.
  bool Take(DeviceRowOps& ops, const Received& received, std::vector<Pending>& pending,
            int64_t rows, int64_t width, float* out, void* stream, absl::Status* failure);

  Transport* const transport_;
  DeviceChannels* const channels_;
  const ModelConfig config_;
  const RemoteDeviceExpertsOptions options_;

  mutable absl::Mutex mu_;
  ClusterPlacement placement_ ABSL_GUARDED_BY(mu_);

  // Stepping thread only.
  uint64_t next_step_id_ = 1;
  std::vector<int32_t> host_ids_;
  std::vector<float> host_weights_;
  std::atomic<int64_t> layers_served_{0}, layers_failed_{0};
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_DEVICE_EXPERTS_H_
