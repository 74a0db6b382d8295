#include "router/router_step.h"

#include <algorithm>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/rms_norm.h"

namespace k3 {

void PrepareRouterStep(const RouterWeights& weights, const ModelConfig& config, const float* x,
                       int64_t tokens, int num_workers, const WorkerForExpert& worker_for,
                       RouterStep* step) {
  step->tokens = tokens;
  step->width = config.ExpertWidth();
  RouteTokens(weights, config, x, tokens, &step->routing);
  step->latent.clear();
  if (config.IsLatentMoe()) {
    step->latent.resize(static_cast<size_t>(tokens * step->width));
    MatMul(weights.latent_down, x, tokens, step->latent.data());
  }
  BuildDispatchPlan(step->routing, num_workers, worker_for, &step->plan);
}

void GatherWorkerRows(const RouterStep& step, const float* x, int worker, float* out) {
  const float* rows = step.latent.empty() ? x : step.latent.data();
  const std::vector<int32_t>& sent = step.plan.workers[worker].tokens;
  for (size_t r = 0; r < sent.size(); ++r) {
    std::memcpy(out + r * step.width, rows + sent[r] * step.width, sizeof(float) * step.width);
  }
}

void FinishRouterStep(const RouterWeights& weights, const ModelConfig& config,
                      const RouterStep& step, const std::vector<const float*>& partials,
                      float* out) {
  std::fill(out, out + step.tokens * step.width, 0.f);
  CombinePartials(step.plan, partials, step.width, out);
  if (config.IsLatentMoe() && config.latent_moe_use_norm) {
    RmsNormRows(out, step.width, step.tokens, step.width, weights.latent_norm.data(),
                config.rms_norm_eps, out, step.width);
  }
}

}  // namespace k3
