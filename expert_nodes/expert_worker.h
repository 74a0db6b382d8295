// ExpertWorker: an expert node's data-plane service. It answers the routers' ExpertRequests
// (router/moe_wire.h) for the experts its worker slot hosts, with RunExperts, the same computation
// the single-process engine runs.
//
// The placement names workers per MoE layer; an ExpertRequest names the MODEL layer. A request
// fails (with the status in its ExpertResponse, never by dropping it) when its layer has no routed
// experts, its width is not the config's ExpertWidth(), or it assigns a row to an expert this worker
// does not host in that layer.
//
// Thread-compatible: one thread serves (the kernels inside use the thread pool).
#ifndef K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_
#define K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cluster/cluster_placement.h"
#include "cluster/transport.h"
#include "expert_nodes/expert_compute.h"
#include "model/glu_params.h"
#include "model/weights.h"
#include "router/moe_wire.h"

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
  // `weights` must hold every expert of `hosting` in every MoE layer (null when hosting nothing).
  // `name` says who answers in error messages ("expert node 4").
  ExpertWorker(std::shared_ptr<const ModelWeights> weights, ExpertHosting hosting,
               std::string name);

  const ExpertHosting& hosting() const { return hosting_; }
  const std::shared_ptr<const ModelWeights>& weights() const { return weights_; }
  int64_t rows_processed() const { return rows_processed_; }

  // Computes the partial sums of `request`; errors travel in the response's status.
  ExpertResponse Serve(const ExpertRequest& request);

  struct Outcome {
    bool deferred = false;  // left unanswered, see Handle
    absl::Status answer;    // the status the answer carried (OK for messages that need none)
  };
  // Handles one received data-plane message: an ExpertRequest is answered to its sender (a
  // malformed one with INVALID_ARGUMENT); anything else is logged and dropped. With `may_defer`, a
  // request this worker cannot serve but that was sent under a newer placement than the worker's
  // is not answered (deferred): the node has not seen that placement yet, and the worker built
  // for it will answer. A failed Send is logged.
  Outcome Handle(Transport* transport, const Received& received, bool may_defer);

 private:
  absl::Status Check(const ExpertRequest& request) const;

  const std::shared_ptr<const ModelWeights> weights_;
  const ExpertHosting hosting_;
  const std::string name_;
  std::vector<std::vector<bool>> hosted_;  // [MoE layer][expert]
  GluParams glu_;
  ExpertScratch scratch_;
  int64_t rows_processed_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_EXPERT_WORKER_H_
