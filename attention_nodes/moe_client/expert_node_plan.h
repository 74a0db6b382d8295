// ExpertNodePlan: which expert node computes which (row, expert) pair of one MoE layer when a GPU
// attention worker sends its rows to the expert nodes itself, over device channels (issue 21;
// attention_nodes/moe_client/remote_device_experts.h), instead of through the router tier.
//
// The rows are not gathered per node: every node involved receives all of the layer's rows and
// answers a partial sum for each (zero where it had no pair), and the attention worker adds the
// answers. At decode sizes a row's top-k experts (16 in K3) reach most expert nodes anyway, so
// gathering would save little and cost a launch and a map per node. Replicas split an expert's
// rows by row index (ExpertPlacement::WorkerForToken), the choice the routers make.
//
// A plain function of its inputs; thread-safe.
#ifndef K3SERVE_ATTENTION_NODES_MOE_CLIENT_EXPERT_NODE_PLAN_H_
#define K3SERVE_ATTENTION_NODES_MOE_CLIENT_EXPERT_NODE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "moe/cluster_placement.h"
#include "moe/expert_assignment.h"

namespace k3 {

struct NodeAssignments {
  uint32_t node = 0;                          // the expert node's id
  std::vector<ExpertAssignment> assignments;  // rows index the layer's rows
};

// The pairs of MoE layer `moe_layer` (placement numbering) for the gate's routing: ids and
// weights [rows, top_k], row-major. Nodes in ascending id order, only those with a pair; within a
// node, pairs in (row, k) order. FailedPrecondition when nothing is placed; InvalidArgument for a
// layer or expert id outside the placement.
absl::StatusOr<std::vector<NodeAssignments>> PlanExpertNodes(const ClusterPlacement& placement,
                                                             int moe_layer, const int32_t* ids,
                                                             const float* weights, int64_t rows,
                                                             int32_t top_k);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_MOE_CLIENT_EXPERT_NODE_PLAN_H_
