#include "router/router_load_stats.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

absl::StatusOr<std::unique_ptr<RouterLoadStats>> RouterLoadStats::Create(
    int num_experts, int top_k, const std::vector<std::vector<float>>& bias, int qb_bins) {
  if (num_experts < 1 || top_k < 1 || top_k > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("load statistics need 1 <= top_k (", top_k, ") <= num_experts (",
                     num_experts, ")"));
  }
  if (qb_bins < 0) {
    return absl::InvalidArgumentError(absl::StrCat("qb_bins is ", qb_bins, "; must be >= 0"));
  }
  for (size_t layer = 0; layer < bias.size(); ++layer) {
    if (static_cast<int>(bias[layer].size()) != num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", layer, " has ",
                                                     bias[layer].size(), " bias values for ",
                                                     num_experts, " experts"));
    }
    if (qb_bins == 0) continue;
    // Validates what FreshQb builds later.
    K3_ASSIGN_OR_RETURN(
        QbLayerStatistics layer_qb,
        QbLayerStatistics::Create(static_cast<int>(layer), top_k, bias[layer], qb_bins));
  }
  return std::unique_ptr<RouterLoadStats>(new RouterLoadStats(num_experts, top_k, bias, qb_bins));
}

RouterLoadStats::RouterLoadStats(int num_experts, int top_k, std::vector<std::vector<float>> bias,
                                 int qb_bins)
    : top_k_(top_k),
      qb_bins_(qb_bins),
      bias_(std::move(bias)),
      counts_(bias_.size(), std::vector<uint64_t>(num_experts, 0)),
      qb_(FreshQb()) {}

std::vector<QbLayerStatistics> RouterLoadStats::FreshQb() const {
  std::vector<QbLayerStatistics> qb;
  if (qb_bins_ == 0) return qb;
  for (size_t layer = 0; layer < bias_.size(); ++layer) {
    qb.push_back(*QbLayerStatistics::Create(static_cast<int>(layer), top_k_, bias_[layer], qb_bins_));
  }
  return qb;
}

void RouterLoadStats::Record(int moe_layer, const Routing& routing) {
  CHECK(moe_layer >= 0 && moe_layer < num_layers()) << "MoE layer " << moe_layer;
  CHECK_EQ(routing.top_k, top_k_);
  ++steps_;
  tokens_ += static_cast<uint64_t>(routing.tokens);
  std::vector<uint64_t>& counts = counts_[moe_layer];
  for (int32_t expert : routing.experts) ++counts[expert];
  if (!qb_.empty() && routing.tokens > 0) {
    qb_[moe_layer].RecordRouted(routing.scores.data(), routing.experts.data(), routing.tokens);
  }
}

pb::LoadStatsResponse RouterLoadStats::Snapshot(bool reset, int64_t placement_version) {
  pb::LoadStatsResponse response;
  response.set_placement_version(placement_version);
  response.set_window_steps(steps_);
  response.set_window_tokens(tokens_);
  for (int layer = 0; layer < num_layers(); ++layer) {
    pb::LayerLoadStats* out = response.add_layers();
    out->set_layer(layer);
    out->set_top_k(top_k_);
    for (uint64_t c : counts_[layer]) out->add_counts(c);
    for (float b : bias_[layer]) out->add_bias(b);
    if (qb_.empty()) continue;
    const QbLayerStatistics& qb = qb_[layer];
    for (uint64_t c : qb.data().counts) out->add_bins(c);
    for (int b = 1; b <= qb.bins(); ++b) out->add_bin_edges(qb.range_lo() + b * qb.bin_width());
  }
  if (reset) {
    steps_ = 0;
    tokens_ = 0;
    for (std::vector<uint64_t>& counts : counts_) std::fill(counts.begin(), counts.end(), 0);
    qb_ = FreshQb();
  }
  return response;
}

void RouterLoadStats::SetBias(int moe_layer, std::vector<float> bias) {
  CHECK(moe_layer >= 0 && moe_layer < num_layers()) << "MoE layer " << moe_layer;
  CHECK_EQ(bias.size(), bias_[moe_layer].size());
  bias_[moe_layer] = std::move(bias);
  std::fill(counts_[moe_layer].begin(), counts_[moe_layer].end(), 0);
  if (!qb_.empty()) {
    qb_[moe_layer] = *QbLayerStatistics::Create(moe_layer, top_k_, bias_[moe_layer], qb_bins_);
  }
}

double RouterLoadStats::MaxVio(int moe_layer) const {
  return k3::MaxVio(counts_[moe_layer]);
}

}  // namespace k3
