#include "engine/local_routed_moe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "router/dispatch_plan.h"
#include "router/gate.h"

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
  const WorkerForExpert one_worker = [](int32_t, int64_t) { return 0; };
  PrepareRouterStep(moe.router, config, x, tokens, /*num_workers=*/1, one_worker, &step_);
  if (hook_) {
    K3_RETURN_IF_ERROR(ApplyHook(layer));
    BuildDispatchPlan(step_.routing, /*num_workers=*/1, one_worker, &step_.plan);
  }
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

absl::Status LocalRoutedMoe::ApplyHook(int layer) {
  Routing& routing = step_.routing;
  const std::vector<int32_t> chosen = routing.experts;
  hook_(layer, &routing);
  if (routing.experts == chosen) return absl::OkStatus();
  if (routing.experts.size() != chosen.size()) {
    return absl::InvalidArgumentError("the routing hook changed the number of assignments");
  }
  const ModelConfig& config = weights_->config;
  for (int64_t t = 0; t < routing.tokens; ++t) {
    const int32_t* ids = routing.experts.data() + t * routing.top_k;
    for (int s = 0; s < routing.top_k; ++s) {
      if (ids[s] < 0 || ids[s] >= routing.num_experts ||
          std::find(ids, ids + s, ids[s]) != ids + s) {
        return absl::InvalidArgumentError(
            absl::StrCat("the routing hook gave token ", t, " expert ", ids[s], " twice or out of range"));
      }
    }
    WeighExperts(routing.scores.data() + t * routing.num_experts, ids, routing.top_k,
                 config.moe_renormalize, config.routed_scaling_factor,
                 routing.weights.data() + t * routing.top_k);
  }
  return absl::OkStatus();
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
