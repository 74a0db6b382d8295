#include "attention_nodes/moe_client/expert_node_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Two MoE layers of 4 experts on workers 0 and 1 (nodes 7 and 3): experts 0-1 on worker 0,
// 2-3 on worker 1; in layer 1 expert 2 also has a replica on worker 0.
ClusterPlacement TwoNodes() {
  ClusterPlacement placement;
  placement.experts.version = 5;
  placement.experts.num_workers = 2;
  placement.experts.num_experts = 4;
  placement.experts.hosts = {{{0}, {0}, {1}, {1}}, {{0}, {0}, {0, 1}, {1}}};
  placement.worker_nodes = {7, 3};
  return placement;
}

TEST(ExpertNodePlanTest, SplitsPairsByHostingNode) {
  // Row 0 picks experts 1 and 2, row 1 picks 3 and 0.
  const std::vector<int32_t> ids = {1, 2, 3, 0};
  const std::vector<float> weights = {0.5f, 0.25f, 0.75f, 0.125f};
  absl::StatusOr<std::vector<NodeAssignments>> plan =
      PlanExpertNodes(TwoNodes(), 0, ids.data(), weights.data(), 2, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  // Ascending node ids: node 3 (worker 1) first.
  EXPECT_EQ((*plan)[0].node, 3u);
  ASSERT_EQ((*plan)[0].assignments.size(), 2u);
  EXPECT_EQ((*plan)[0].assignments[0].row, 0);
  EXPECT_EQ((*plan)[0].assignments[0].expert, 2);
  EXPECT_EQ((*plan)[0].assignments[0].weight, 0.25f);
  EXPECT_EQ((*plan)[0].assignments[1].row, 1);
  EXPECT_EQ((*plan)[0].assignments[1].expert, 3);
  EXPECT_EQ((*plan)[1].node, 7u);
  ASSERT_EQ((*plan)[1].assignments.size(), 2u);
  EXPECT_EQ((*plan)[1].assignments[0].expert, 1);
  EXPECT_EQ((*plan)[1].assignments[1].row, 1);
  EXPECT_EQ((*plan)[1].assignments[1].expert, 0);
  EXPECT_EQ((*plan)[1].assignments[1].weight, 0.125f);
}

TEST(ExpertNodePlanTest, ReplicasSplitRowsByRowIndex) {
  // Every row of layer 1 picks expert 2, which workers 0 and 1 both hold: even rows go to the
  // first replica (worker 0, node 7), odd rows to the second (worker 1, node 3).
  const std::vector<int32_t> ids = {2, 2, 2};
  const std::vector<float> weights = {1, 1, 1};
  absl::StatusOr<std::vector<NodeAssignments>> plan =
      PlanExpertNodes(TwoNodes(), 1, ids.data(), weights.data(), 3, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].node, 3u);
  ASSERT_EQ((*plan)[0].assignments.size(), 1u);
  EXPECT_EQ((*plan)[0].assignments[0].row, 1);
  EXPECT_EQ((*plan)[1].node, 7u);
  ASSERT_EQ((*plan)[1].assignments.size(), 2u);
  EXPECT_EQ((*plan)[1].assignments[0].row, 0);
  EXPECT_EQ((*plan)[1].assignments[1].row, 2);
}

TEST(ExpertNodePlanTest, RefusesWhatThePlacementCannotServe) {
  const std::vector<int32_t> bad_expert = {4};
  const std::vector<float> weight = {1};
  EXPECT_EQ(PlanExpertNodes(TwoNodes(), 0, bad_expert.data(), weight.data(), 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> good = {0};
  EXPECT_EQ(PlanExpertNodes(TwoNodes(), 2, good.data(), weight.data(), 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PlanExpertNodes(ClusterPlacement{}, 0, good.data(), weight.data(), 1, 1).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace k3
