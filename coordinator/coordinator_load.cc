#include "coordinator/coordinator_load.h"

#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "coordinator/expert_placement_planner.h"
#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

// A layer of one router's answer, checked and converted.
struct LayerUpdate {
  int layer = 0;
  std::vector<uint64_t> loads;
  uint64_t tokens = 0;
  std::optional<QbLayerStatistics> qb;
};

absl::StatusOr<LayerUpdate> CheckLayer(const pb::LayerLoadStats& in, int num_layers,
                                       int num_experts) {
  LayerUpdate update;
  update.layer = in.layer();
  if (in.layer() < 0 || in.layer() >= num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer ", in.layer(), " is outside [0, ", num_layers, ")"));
  }
  const std::string where = absl::StrCat("MoE layer ", in.layer(), ": ");
  if (in.counts_size() != num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, in.counts_size(), " expert loads for ", num_experts, " experts"));
  }
  update.loads.assign(in.counts().begin(), in.counts().end());
  const uint64_t routed = std::accumulate(update.loads.begin(), update.loads.end(), uint64_t{0});
  if (in.top_k() < 0 || in.top_k() > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(where, "top_k ", in.top_k()));
  }
  if (in.top_k() > 0) {
    if (routed % static_cast<uint64_t>(in.top_k()) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, routed, " routed tokens are not a multiple of top_k ", in.top_k()));
    }
    update.tokens = routed / static_cast<uint64_t>(in.top_k());
  }
  if (in.bins_size() == 0) return update;

  // QB histograms: expert-major [num_experts x B], B the number of bin edges.
  const int bins = in.bin_edges_size();
  if (bins < 1 ||
      static_cast<int64_t>(in.bins_size()) != static_cast<int64_t>(bins) * num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(where, in.bins_size(), " histogram counts for ",
                                                   num_experts, " experts and ", bins,
                                                   " bin edges"));
  }
  if (in.bias_size() != num_experts || in.top_k() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, "QB histograms need the routing bias (",
                                                   in.bias_size(), " values for ", num_experts,
                                                   " experts) and top_k (", in.top_k(), ")"));
  }
  QbLayerStatisticsData data;
  data.layer = in.layer();
  data.top_k = in.top_k();
  data.bins = bins;
  data.bias.assign(in.bias().begin(), in.bias().end());
  data.loads = update.loads;
  data.counts.assign(in.bins().begin(), in.bins().end());
  data.tokens = std::accumulate(data.counts.begin(), data.counts.begin() + bins, uint64_t{0});
  absl::StatusOr<QbLayerStatistics> qb = QbLayerStatistics::FromData(std::move(data));
  if (!qb.ok()) return absl::InvalidArgumentError(absl::StrCat(where, qb.status().message()));
  update.tokens = qb->tokens();
  update.qb = *std::move(qb);
  return update;
}

}  // namespace

LoadWindow::LoadWindow(int num_layers, int num_experts, absl::Time start)
    : start_(start), num_experts_(num_experts) {
  CHECK_GE(num_layers, 1);
  CHECK_GE(num_experts, 1);
  layers_.resize(num_layers);
  Reset(start);
}

void LoadWindow::Reset(absl::Time start) {
  start_ = start;
  for (Layer& layer : layers_) layer = Layer{std::vector<uint64_t>(num_experts_, 0)};
}

absl::Status LoadWindow::Add(const pb::LoadStatsResponse& response) {
  std::vector<LayerUpdate> updates;
  std::set<int> seen;
  for (const pb::LayerLoadStats& in : response.layers()) {
    K3_ASSIGN_OR_RETURN(LayerUpdate update, CheckLayer(in, num_layers(), num_experts_));
    if (!seen.insert(update.layer).second) {
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", update.layer, " twice"));
    }
    updates.push_back(std::move(update));
  }
  for (LayerUpdate& update : updates) {
    Layer& layer = layers_[update.layer];
    for (int e = 0; e < num_experts_; ++e) layer.loads[e] += update.loads[e];
    layer.tokens += update.tokens;
    if (!update.qb.has_value() || layer.qb_conflict) continue;
    if (!layer.qb.has_value()) {
      layer.qb = std::move(update.qb);
    } else if (absl::Status merged = layer.qb->Merge(*update.qb); !merged.ok()) {
      LOG(INFO) << "MoE layer " << update.layer << ": no QB estimate in this window ("
                << merged.message() << ")";
      layer.qb.reset();
      layer.qb_conflict = true;
    }
  }
  return absl::OkStatus();
}

uint64_t LoadWindow::total_tokens() const {
  uint64_t total = 0;
  for (const Layer& layer : layers_) total += layer.tokens;
  return total;
}

std::vector<std::vector<double>> LoadWindow::ExpertLoads() const {
  std::vector<std::vector<double>> loads;
  for (const Layer& layer : layers_) loads.emplace_back(layer.loads.begin(), layer.loads.end());
  return loads;
}

const QbLayerStatistics* LoadWindow::qb(int layer) const {
  const std::optional<QbLayerStatistics>& qb = layers_[layer].qb;
  return qb.has_value() ? &*qb : nullptr;
}

pb::LoadReport LoadWindow::Report(const ClusterPlacement& placement) const {
  pb::LoadReport report;
  report.set_placement_version(placement.version());
  report.set_window_start_unix_ms(absl::ToUnixMillis(start_));
  const bool placed = placement.placed() && placement.experts.num_experts == num_experts_ &&
                      placement.experts.num_layers() == num_layers();
  double worker_max_vio = 0;
  for (int l = 0; l < num_layers(); ++l) {
    const Layer& layer = layers_[l];
    pb::LayerLoadReport* out = report.add_layers();
    out->set_layer(l);
    out->set_tokens(layer.tokens);
    out->mutable_expert_loads()->Add(layer.loads.begin(), layer.loads.end());
    out->set_expert_max_vio(MaxVio(layer.loads));
    if (placed) {
      const std::vector<double> loads(layer.loads.begin(), layer.loads.end());
      const std::vector<double> workers = ExpectedWorkerLoad(placement.experts, l, loads);
      out->mutable_worker_loads()->Add(workers.begin(), workers.end());
      out->set_worker_max_vio(WorkerMaxVio(workers));
      worker_max_vio += out->worker_max_vio();
    }
    if (layer.qb.has_value() && layer.qb->tokens() > 0) {
      absl::StatusOr<std::vector<float>> bias = layer.qb->EstimateBias();
      if (bias.ok()) {
        const std::vector<float> centred = CenterBias(*bias);
        out->mutable_qb_bias()->Add(centred.begin(), centred.end());
      }
    }
  }
  report.set_worker_max_vio(placed ? worker_max_vio / num_layers() : 0);
  return report;
}

}  // namespace k3
