#include "attention_nodes/moe_client/expert_node_plan.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<std::vector<NodeAssignments>> PlanExpertNodes(const ClusterPlacement& placement,
                                                             int moe_layer, const int32_t* ids,
                                                             const float* weights, int64_t rows,
                                                             int32_t top_k) {
  if (!placement.placed()) {
    return absl::FailedPreconditionError("no expert placement yet");
  }
  const ExpertPlacement& experts = placement.experts;
  if (moe_layer < 0 || moe_layer >= experts.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("MoE layer ", moe_layer, " outside the ",
                                                   experts.num_layers(), " placed layers"));
  }
  std::map<uint32_t, std::vector<ExpertAssignment>> by_node;
  for (int64_t row = 0; row < rows; ++row) {
    for (int32_t k = 0; k < top_k; ++k) {
      const int32_t expert = ids[row * top_k + k];
      if (expert < 0 || expert >= experts.num_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", row, " chose expert ", expert, " of ", experts.num_experts));
      }
      const int worker = experts.WorkerForToken(moe_layer, expert, row);
      by_node[placement.worker_nodes[worker]].push_back(
          ExpertAssignment{static_cast<int32_t>(row), expert, weights[row * top_k + k]});
    }
  }
  std::vector<NodeAssignments> plan;
  for (auto& [node, assignments] : by_node) {
    plan.push_back(NodeAssignments{node, std::move(assignments)});
  }
  return plan;
}

}  // namespace k3
