#include "router/dispatch_plan.h"

#include <algorithm>

namespace k3 {

void BuildDispatchPlan(const Routing& routing, int num_workers, const WorkerForExpert& worker_for,
                       DispatchPlan* plan) {
  plan->workers.assign(num_workers, WorkerDispatch{});
  std::vector<int32_t> row_on_worker(num_workers, -1);
  for (int64_t t = 0; t < routing.tokens; ++t) {
    std::fill(row_on_worker.begin(), row_on_worker.end(), -1);
    for (int s = 0; s < routing.top_k; ++s) {
      const int32_t expert = routing.experts[t * routing.top_k + s];
      const int worker = worker_for(expert, t);
      WorkerDispatch& dispatch = plan->workers[worker];
      if (row_on_worker[worker] < 0) {
        row_on_worker[worker] = static_cast<int32_t>(dispatch.tokens.size());
        dispatch.tokens.push_back(static_cast<int32_t>(t));
      }
      dispatch.assignments.push_back(
          ExpertAssignment{row_on_worker[worker], expert, routing.weights[t * routing.top_k + s]});
    }
  }
}

void CombinePartials(const DispatchPlan& plan, const std::vector<const float*>& partials,
                     int64_t width, float* out) {
  for (size_t w = 0; w < plan.workers.size(); ++w) {
    const std::vector<int32_t>& tokens = plan.workers[w].tokens;
    for (size_t row = 0; row < tokens.size(); ++row) {
      const float* src = partials[w] + row * width;
      float* dst = out + static_cast<int64_t>(tokens[row]) * width;
      for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace k3
