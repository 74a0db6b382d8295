// ExpertWorker: an expert node's data-plane service. It answers the routers' ExpertRequests
// (moe/moe_wire.h) for the experts its worker slot hosts, with RunExperts, the same computation
// the single-process engine runs.
//
// While a new placement rolls out (proto/cluster.proto, LoadExpertsRequest) a node holds the
// experts of several placement versions at once: routers switch between steps, and a step planned
// with the old version still sends its rows under that version. Each request is served with the
// experts of the version it names, or, when that one is not held, of the newest older version held
// (or the oldest held, for a request older than all of them); placement moves no math, so any
// version that hosts the request's experts gives the same answer.
//
// The placement names workers per MoE layer; an ExpertRequest names the MODEL layer. A request
// fails (with the status in its ExpertResponse, never by dropping it) when its layer has no routed
// experts, its width is not the config's ExpertWidth(), or it assigns a row to an expert the
// serving version does not host in that layer.
//
// With a DeviceExperts (UseDevice; `k3serve expert --device cuda:N`), requests are computed there
// instead, with the same contract.
//
// Device rows (issue 21: GPU tiers talk GPU to GPU): a GPU attention worker may send a request
// with rows_on_device (moe/moe_wire.h), its rows following on the device channel from it to this
// node (set_device_channels, cluster/device_channels.h). The worker takes them from that channel
// into device memory at once (so the channel stays in step with the sender, whatever the answer),
// computes with DeviceExperts::RunDeviceRows, sends the ExpertResponse (rows_on_device) and then
// the partial sums on its channel to the sender. Such a request is never deferred: one the worker
// cannot serve is answered with the error and the sender takes the router tier's path. When a
// channel fails, or the worker has no channel or no device to take the rows, the channel is
// reported broken (the coordinator issues a new one) and the request answered with UNAVAILABLE.
//
// Thread-compatible: one thread serves (the kernels inside use the thread pool).
#ifndef K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_
#define K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "moe/cluster_placement.h"
#include "cluster/device_channels.h"
#include "cluster/span_log.h"
#include "cluster/transport.h"
#include "expert_nodes/device_experts.h"
#include "expert_nodes/expert_compute.h"
#include "model/glu_params.h"
#include "model/weights.h"
#include "moe/moe_wire.h"

namespace k3 {

// The experts one expert node hosts.
struct ExpertHosting {
  int64_t placement_version = 0;  // the placement it comes from; 0: none yet
  int worker = -1;                // the node's worker slot; -1: it holds none (a spare)
  std::vector<std::vector<int>> experts;  // [MoE layer] -> ascending expert ids

  // Every expert hosted in some layer, ascending: what WeightSelection::Experts must load.
  std::vector<int> Union() const;
  int64_t TotalExperts() const;  // summed over layers
  bool operator==(const ExpertHosting&) const = default;
};

// What `node` hosts under `placement` (experts empty when it holds no worker slot).
ExpertHosting HostingFor(const ClusterPlacement& placement, uint32_t node);

class ExpertWorker {
 public:
  // Holds one version: `hosting` (of placement version hosting.placement_version) with `weights`,
  // which must hold every expert of `hosting` in every MoE layer (null when hosting nothing).
  // `name` says who answers in error messages ("expert node 4").
  ExpertWorker(std::shared_ptr<const ModelWeights> weights, ExpertHosting hosting,
               std::string name);

  // The newest (highest) version held, and its weights.
  const ExpertHosting& hosting() const { return versions_.rbegin()->second.hosting; }
  const std::shared_ptr<const ModelWeights>& weights() const {
    return versions_.rbegin()->second.weights;
  }
  int64_t rows_processed() const { return rows_processed_; }
  // (row, expert) pairs computed, by model layer (ExpertRequest.layer); as long as the highest
  // layer served plus one.
  const std::vector<int64_t>& assignments_per_layer() const { return assignments_per_layer_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // Where spans of traced requests go ("k3.experts", under the router's layer span); null: none.
  // Not owned; must outlive the worker.
  void set_span_log(SpanLog* spans) { spans_ = spans; }
  // Where requests with rows_on_device find their channels (see the file comment); null: such
  // requests fail. Not owned; must outlive the worker.
  void set_device_channels(DeviceChannels* channels) { channels_ = channels; }

  // Computes on `device` (null: the CPU, RunExperts) from now on, after copying the weights of
  // every version held to it; the first copy's error, if any (versions whose copy failed answer
  // with it).
  absl::Status UseDevice(std::unique_ptr<DeviceExperts> device);
  // Adds the experts of another placement version (weights as for the constructor); a version
  // already held is replaced. With a device, the weights are copied to it: DeviceStatus says
  // whether that worked.
  void AddVersion(std::shared_ptr<const ModelWeights> weights, ExpertHosting hosting);
  // The device copy's status of a held version (OK without a device, or when not held).
  absl::Status DeviceStatus(int64_t version) const;
  // Device bytes of the copied weights; 0 on the CPU.
  int64_t device_weight_bytes() const { return device_ ? device_->weight_bytes() : 0; }
  // Drops every version held for which keep(version) is false; when that would be all of them,
  // the newest stays.
  void DropVersions(const std::function<bool(int64_t version)>& keep);
  // The placement versions held, ascending.
  std::vector<int64_t> versions() const;
  // The hosting of a held version; null when not held.
  const ExpertHosting* FindVersion(int64_t version) const;
  // Weights of a held version that hold every expert in `experts` (in every MoE layer); null if
  // none does. Lets a node reuse its mappings for a new version.
  std::shared_ptr<const ModelWeights> WeightsWith(const std::vector<int>& experts) const;
  // Bytes of the distinct weights the held versions use.
  int64_t weight_bytes() const;

  // Answers `request` (its fields; request.rows is not read) whose rows are `rows` (read in place
  // from its message): the encoded ExpertResponse, the partial sums computed straight into it.
  // Errors travel in the response's status, which is also stored in *status.
  std::string Serve(const ExpertRequest& request, absl::Span<const float> rows,
                    absl::Status* status);

  struct Outcome {
    bool deferred = false;  // left unanswered, see Handle
    absl::Status answer;    // the status the answer carried (OK for messages that need none)
  };
  // Handles one received data-plane message: an ExpertRequest is answered to its sender (a
  // malformed one with INVALID_ARGUMENT); anything else is logged and dropped. With `may_defer`, a
  // request this worker cannot serve but that was sent under a newer placement than any it holds
  // is not answered (deferred): the node has not seen that placement yet, and will serve it once
  // it holds it. A failed Send is logged.
  Outcome Handle(Transport* transport, const Received& received, bool may_defer);

 private:
  struct Version {
    std::shared_ptr<const ModelWeights> weights;
    ExpertHosting hosting;
    std::vector<std::vector<bool>> hosted;  // [MoE layer][expert]
    absl::Status on_device;                 // the copy to device_, if any
  };

  // The version that serves a request sent under `requested` (see the file comment).
  const Version& VersionFor(uint64_t requested) const;
  absl::Status Check(const ExpertRequest& request, const Version& version) const;
  // Frees the device copies of weights no held version uses any more.
  void ForgetUnusedOnDevice();
  // Adds a served request to rows_processed_ and assignments_per_layer_.
  void CountServed(const ExpertRequest& request);
  // A request with rows_on_device from `from`: takes its rows from the channel, answers over
  // `transport`, then sends the partial sums on the channel back. Returns the answer's status.
  absl::Status ServeDeviceRows(Transport* transport, PeerId from, const ExpertRequest& request);
  // Receives the request's rows into device memory and computes the answer there; *answer is
  // where the partial sums lie, *took_rows whether the rows came off the channel.
  absl::Status ComputeDeviceRows(PeerId from, const ExpertRequest& request, const float** answer,
                                 bool* took_rows);

  std::string name_;
  std::map<int64_t, Version> versions_;  // by placement version; never empty
  GluParams glu_;
  ExpertScratch scratch_;
  std::unique_ptr<DeviceExperts> device_;  // null: RunExperts on the CPU
  std::set<std::shared_ptr<const ModelWeights>> on_device_;  // what device_ holds a copy of
  int64_t rows_processed_ = 0;
  std::vector<int64_t> assignments_per_layer_;
  SpanLog* spans_ = nullptr;
  DeviceChannels* channels_ = nullptr;
};

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_
