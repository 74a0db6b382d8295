#include "engine/local_routed_moe.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace k3 {

LocalRoutedMoe::LocalRoutedMoe(const ModelWeights* weights, ExpertRunner experts)
    : weights_(weights), experts_(std::move(experts)), glu_(GluParamsFor(weights->config)) {}

absl::Status LocalRoutedMoe::Begin(int layer, const float* x, int64_t tokens) {
  const ModelConfig& config = weights_->config;
  if (layer < 0 || layer >= config.num_hidden_layers || !config.IsMoe(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is not a MoE layer"));
  }
  layer_ = layer;
  const MoeWeights& moe = weights_->layers[layer].moe;
  PrepareRouterStep(
      moe.router, config, x, tokens, /*num_workers=*/1, [](int32_t, int64_t) { return 0; }, &step_);
  const int64_t rows = static_cast<int64_t>(step_.plan.workers[0].tokens.size());
  rows_.resize(static_cast<size_t>(rows * step_.width));
  GatherWorkerRows(step_, x, /*worker=*/0, rows_.data());
  partial_.resize(rows_.size());
  const std::vector<ExpertAssignment>& assignments = step_.plan.workers[0].assignments;
  status_ = experts_
                ? experts_(layer, rows_.data(), rows, step_.width, assignments, partial_.data())
                : RunExperts(moe.experts, glu_, rows_.data(), rows, step_.width, assignments,
                             partial_.data(), &scratch_);
  return status_;
}

absl::Status LocalRoutedMoe::Wait(float* out) {
  if (layer_ < 0) return absl::FailedPreconditionError("Wait without Begin");
  if (!status_.ok()) return status_;
  FinishRouterStep(weights_->layers[layer_].moe.router, weights_->config, step_, {partial_.data()},
                   out);
  layer_ = -1;
  return absl::OkStatus();
}

}  // namespace k3
