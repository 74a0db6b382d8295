// DispatchPlan: which token rows go to which expert worker for one MoE layer step, and how their
// answers combine. A row goes once to a worker even when several of its chosen experts live there;
// the worker returns one partial sum per row it received, and the router adds the partials.
#ifndef K3SERVE_ROUTER_DISPATCH_PLAN_H_
#define K3SERVE_ROUTER_DISPATCH_PLAN_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "moe/expert_assignment.h"
#include "router/gate.h"

namespace k3 {

struct WorkerDispatch {
  std::vector<int32_t> tokens;                // token index of each row sent, in send order
  std::vector<ExpertAssignment> assignments;  // rows index into `tokens`
};

struct DispatchPlan {
  std::vector<WorkerDispatch> workers;  // indexed by worker slot
};

// Maps (expert, token) to the worker slot that serves it; with replicas, the choice may depend on
// the token so that replicas split an expert's tokens.
using WorkerForExpert = std::function<int(int32_t expert, int64_t token)>;

void BuildDispatchPlan(const Routing& routing, int num_workers, const WorkerForExpert& worker_for,
                       DispatchPlan* plan);

// out[token] += partial[row] for every row a worker answered. `partials[w]` is
// [workers[w].tokens.size(), width].
void CombinePartials(const DispatchPlan& plan, const std::vector<const float*>& partials,
                     int64_t width, float* out);

}  // namespace k3

#endif  // K3SERVE_ROUTER_DISPATCH_PLAN_H_
