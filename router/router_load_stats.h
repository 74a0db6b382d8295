// RouterLoadStats: what a router learns about expert load from the tokens it routes, per MoE layer,
// over a window that GetLoadStats may reset:
//   - tokens routed to each expert (the load an expert placement must balance), and
//   - QB statistics (moe/qb_statistics.h): per expert, the histogram of r = α − s that a new
//     e_score_correction_bias is estimated from. Histograms of routers with the same bias add up.
//
// In the wire form (k3serve.cluster.v1.LoadStatsResponse) each LayerLoadStats carries `counts` =
// tokens per expert, `top_k` and `bias` (the routing bias), and, when QB statistics are kept,
// `bins` = the r histograms expert-major ([num_experts x B]) with `bin_edges` = the B upper bin
// edges, which all experts share: the bins split [min(bias) − 1, max(bias) + 1] evenly, and every
// r falls inside, so no bin is unbounded.
//
// Thread-safety: none; its owner (RouterCore, on the router's actor) makes every call.
#ifndef K3SERVE_ROUTER_ROUTER_LOAD_STATS_H_
#define K3SERVE_ROUTER_ROUTER_LOAD_STATS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"
#include "router/gate.h"
#include "moe/qb_statistics.h"

namespace k3 {

class RouterLoadStats {
 public:
  // `bias[moe_layer]`: the layer's e_score_correction_bias, the bias its tokens are routed with.
  // qb_bins 0 keeps no QB statistics. INVALID_ARGUMENT for inconsistent sizes, QB statistics with
  // num_experts <= top_k, or a negative qb_bins.
  static absl::StatusOr<std::unique_ptr<RouterLoadStats>> Create(
      int num_experts, int top_k, const std::vector<std::vector<float>>& bias, int qb_bins);

  int num_layers() const { return static_cast<int>(counts_.size()); }

  // Records one routed step of MoE layer `moe_layer` (REQUIRES: in range; routing of this
  // config's num_experts and top_k, with scores).
  void Record(int moe_layer, const Routing& routing);

  // The window so far; `reset` starts a new one.
  k3serve::cluster::v1::LoadStatsResponse Snapshot(bool reset, int64_t placement_version);

  // (max load − mean load) / mean load of the layer's window so far; 0 before any token.
  double MaxVio(int moe_layer) const;

  // The layer's tokens are routed with `bias` from now on (online bias): its window starts anew,
  // since r = α − s has another distribution under another bias. REQUIRES: moe_layer in range,
  // one value per expert.
  void SetBias(int moe_layer, std::vector<float> bias);

 private:
  RouterLoadStats(int num_experts, int top_k, std::vector<std::vector<float>> bias, int qb_bins);
  // Empty QB statistics for every layer; none without QB.
  std::vector<QbLayerStatistics> FreshQb() const;

  const int top_k_;
  const int qb_bins_;
  std::vector<std::vector<float>> bias_;  // [layer]
  uint64_t steps_ = 0;
  uint64_t tokens_ = 0;
  std::vector<std::vector<uint64_t>> counts_;  // [layer][expert]
  std::vector<QbLayerStatistics> qb_;          // [layer]; empty without QB
};

}  // namespace k3

#endif  // K3SERVE_ROUTER_ROUTER_LOAD_STATS_H_
