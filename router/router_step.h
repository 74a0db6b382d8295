// RouterStep: the router's math for one MoE layer step, shared by the in-process engine and the
// router tier so that splitting the model into processes moves no math:
//   Prepare: scores and top-k, the latent down projection z = W↓ x and the DispatchPlan.
//   Gather:  the rows one expert worker gets, written where the caller wants them (the router:
//            straight into that worker's ExpertRequest message).
//   Finish:  adds the workers' partial sums and applies routed_expert_norm.
#ifndef K3SERVE_ROUTER_ROUTER_STEP_H_
#define K3SERVE_ROUTER_ROUTER_STEP_H_

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "router/dispatch_plan.h"
#include "router/gate.h"

namespace k3 {

struct RouterStep {
  int64_t tokens = 0;
  int64_t width = 0;                              // rows sent to experts: ExpertWidth()
  Routing routing;
  std::vector<float> latent;                      // z [tokens, width]
  DispatchPlan plan;
};

void PrepareRouterStep(const RouterWeights& weights, const ModelConfig& config, const float* x,
                       int64_t tokens, int num_workers, const WorkerForExpert& worker_for,
                       RouterStep* step);

// Writes the rows worker `worker` gets, [plan.workers[worker].tokens.size(), width], to `out`;
// `x` is what Prepare was given (read only when the model has no latent projection).
void GatherWorkerRows(const RouterStep& step, const float* x, int worker, float* out);

// partials[w]: [plan.workers[w].tokens.size(), width]; out: [tokens, width].
void FinishRouterStep(const RouterWeights& weights, const ModelConfig& config,
                      const RouterStep& step, const std::vector<const float*>& partials,
                      float* out);

}  // namespace k3

#endif  // K3SERVE_ROUTER_ROUTER_STEP_H_
