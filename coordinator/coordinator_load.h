// LoadWindow: the expert load the routers reported (RouterControl.GetLoadStats), merged over a
// window, and the LoadReport the coordinator derives from it.
//
// Per MoE layer the window adds up the tokens routed to each expert and, when routers keep QB
// statistics (router/router_load_stats.h), their per-expert histograms of r = α − s. Histograms
// only add up under one bias: when routers report a layer under different biases (a bias push
// reached some of them first), the window keeps the loads but no QB estimate for that layer.
//
// A plain value; not synchronized.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_LOAD_H_
#define K3SERVE_COORDINATOR_COORDINATOR_LOAD_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "moe/cluster_placement.h"
#include "proto/cluster.pb.h"
#include "moe/qb_statistics.h"

namespace k3 {

class LoadWindow {
 public:
  // REQUIRES: num_layers >= 1, num_experts >= 1.
  LoadWindow(int num_layers, int num_experts, absl::Time start);

  // Adds one router's answer. INVALID_ARGUMENT naming the problem (and nothing added) when a
  // layer is out of range or repeated, `counts` is not one per expert, or the QB fields are
  // inconsistent (sizes, bias, or histograms that do not hold the layer's tokens).
  absl::Status Add(const k3serve::cluster::v1::LoadStatsResponse& response);

  // Empties the window, which now starts at `start`.
  void Reset(absl::Time start);

  absl::Time start() const { return start_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // Tokens routed in `layer` (from the QB histograms, or the loads over top_k).
  uint64_t tokens(int layer) const { return layers_[layer].tokens; }
  uint64_t total_tokens() const;
  // [layer][expert]: tokens routed to each expert, as the placement planner takes them.
  std::vector<std::vector<double>> ExpertLoads() const;
  // The merged QB statistics of `layer`; null when no router sent any under a single bias.
  const QbLayerStatistics* qb(int layer) const;

  // The report of this window. Worker loads need `placement` to be placed and of this window's
  // shape; otherwise they are left empty.
  k3serve::cluster::v1::LoadReport Report(const ClusterPlacement& placement) const;

 private:
  struct Layer {
    std::vector<uint64_t> loads;
    uint64_t tokens = 0;
    std::optional<QbLayerStatistics> qb;
    bool qb_conflict = false;  // routers used different biases: no QB estimate this window
  };

  absl::Time start_;
  int num_experts_;
  std::vector<Layer> layers_;
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_LOAD_H_
