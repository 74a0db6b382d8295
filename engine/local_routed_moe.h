// LocalRoutedMoe: RoutedMoe computed in this process (router math and every routed expert), for the
// single-process engines and the reference tests. Runs synchronously in Begin. The experts run on
// the CPU (RunExperts), or through an ExpertRunner the caller gives (GpuEngine: on a GPU).
#ifndef K3SERVE_ENGINE_LOCAL_ROUTED_MOE_H_
#define K3SERVE_ENGINE_LOCAL_ROUTED_MOE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "expert_nodes/expert_compute.h"
#include "model/weights.h"
#include "moe/routed_moe.h"
#include "router/router_step.h"

namespace k3 {

// RunExperts' contract for MoE layer `layer`: rows z [rows, width], out [rows, width] overwritten.
using ExpertRunner =
    std::function<absl::Status(int layer, const float* z, int64_t rows, int64_t width,
                               const std::vector<ExpertAssignment>& assignments, float* out)>;

class LocalRoutedMoe : public RoutedMoe {
 public:
  // `weights` must hold the router and all expert tensors, and outlive this object. A null
  // `experts` runs them on the CPU.
  explicit LocalRoutedMoe(const ModelWeights* weights, ExpertRunner experts = nullptr);

  absl::Status Begin(int layer, const float* x, int64_t tokens) override;
  absl::Status Wait(float* out) override;
  void Abandon() override { layer_ = -1; }

  // The routing of the last step (for tests and statistics).
  const Routing& last_routing() const { return step_.routing; }

  // For tests that compare two engines' numerics with their routing held equal: called in each
  // Begin after the gate chose, before the experts run, with the layer and the step's routing
  // ([tokens, top_k] experts in choice order, weights, scores). It may only read it, or replace
  // `experts` (same size; each token's ids distinct and in range, else Begin fails with
  // InvalidArgument), in which case the weights are recomputed from the token's scores as the
  // gate weighs its own choice (WeighExperts). Null (the default): no hook.
  using RoutingHook = std::function<void(int layer, Routing* routing)>;
  void set_routing_hook(RoutingHook hook) { hook_ = std::move(hook); }

 private:
  // Calls hook_ on step_.routing and reweighs what it replaced.
  absl::Status ApplyHook(int layer);

  const ModelWeights* weights_;
  ExpertRunner experts_;
  RoutingHook hook_;
  GluParams glu_;
  int layer_ = -1;
  absl::Status status_;
  RouterStep step_;
  std::vector<float> rows_;  // the step's rows, gathered for the one worker
  std::vector<float> partial_;
  ExpertScratch scratch_;
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_LOCAL_ROUTED_MOE_H_
