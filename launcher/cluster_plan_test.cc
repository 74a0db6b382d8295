// Checks PlanCluster's nodes against command lines written out by hand from the rules in
// cluster_plan.h and local_cluster.h (port order, per-role flags, thread split): no processes.
#include "launcher/cluster_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Args = std::vector<std::string>;

ClusterPlanInputs Inputs(std::vector<int> ports, int num_experts, std::vector<int> slots) {
  ClusterPlanInputs in;
  in.binary = "/bin/k3serve";
  in.model = "/models/tiny";
  in.num_experts = num_experts;
  in.expert_slots = std::move(slots);
  in.ports = std::move(ports);
  in.hardware_threads = 8;
  return in;
}

TEST(ClusterPlanTest, EachRoleGetsItsPortAndFlagsInOrder) {
  LocalClusterOptions o;
  o.attention = 1;
  o.routers = 1;
  o.experts = 2;
  o.stop_grace = absl::Seconds(5);
  ASSERT_EQ(PlannedPortCount(o), 5);
  const ClusterPlan plan = PlanCluster(o, Inputs({100, 101, 102, 103, 104}, 8, {4, 4}));
  ASSERT_EQ(plan.nodes.size(), 5u);
  const std::string c = "127.0.0.1:100";
  // Two expert nodes: each gets one node's share (ceil(8 / 2)) of spare slots.
  EXPECT_EQ(plan.nodes[0].name, "coordinator");
  EXPECT_EQ(plan.nodes[0].argv,
            (Args{"/bin/k3serve", "coordinator", "--port", "100", "--model", "/models/tiny",
                  "--host", "127.0.0.1", "--expected-experts", "2", "--required-roles",
                  "attention,router,expert", "--recovery-window-ms", "0",
                  "--spare-slots-per-worker", "4"}));
  EXPECT_EQ(plan.nodes[1].name, "attention-0");
  EXPECT_EQ(plan.nodes[1].argv,
            (Args{"/bin/k3serve", "attention", "--coordinator", c, "--port", "101", "--model",
                  "/models/tiny", "--host", "127.0.0.1", "--drain-timeout-ms", "2500"}));
  EXPECT_EQ(plan.nodes[2].name, "router-0");
  EXPECT_EQ(plan.nodes[2].argv, (Args{"/bin/k3serve", "router", "--coordinator", c, "--port",
                                      "102", "--model", "/models/tiny", "--host", "127.0.0.1"}));
  EXPECT_EQ(plan.nodes[4].name, "expert-1");
  EXPECT_EQ(plan.nodes[4].index, 1);
  EXPECT_EQ(plan.nodes[4].grpc_address, "127.0.0.1:104");
  EXPECT_EQ(plan.nodes[4].argv,
            (Args{"/bin/k3serve", "expert", "--coordinator", c, "--port", "104", "--model",
                  "/models/tiny", "--host", "127.0.0.1", "--slots", "4"}));
  for (const PlannedNode& node : plan.nodes) EXPECT_EQ(node.metrics_address, "") << node.name;
}

TEST(ClusterPlanTest, MetricsPortsFollowAndTheFrontCallsEveryAttentionNode) {
  LocalClusterOptions o;
  o.attention = 2;
  o.routers = 1;
  o.experts = 0;
  o.metrics = true;
  o.http_port = 8080;
  // coordinator, attention-0, attention-1, router-0, http-0; then their metrics ports.
  ASSERT_EQ(PlannedNodeCount(o), 5);
  ASSERT_EQ(PlannedPortCount(o), 10);
  ClusterPlanInputs in = Inputs({10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 0, {});
  in.http_port = 8080;
  const ClusterPlan plan = PlanCluster(o, in);
  ASSERT_EQ(plan.nodes.size(), 5u);
  EXPECT_EQ(plan.nodes[2].metrics_address, "127.0.0.1:17");
  EXPECT_THAT(plan.nodes[0].argv, ElementsAre("/bin/k3serve", "coordinator", "--port", "10",
                                              "--model", "/models/tiny", "--host", "127.0.0.1",
                                              "--metrics-port", "15", "--expected-experts", "0",
                                              "--required-roles", "attention,router",
                                              "--recovery-window-ms", "0"));
  const PlannedNode& front = plan.nodes[4];
  EXPECT_EQ(front.name, "http-0");
  EXPECT_EQ(front.http_address, "127.0.0.1:8080");
  EXPECT_EQ(front.grpc_address, "127.0.0.1:14");
  EXPECT_EQ(front.argv, (Args{"/bin/k3serve", "http", "--server", "127.0.0.1:11,127.0.0.1:12",
                              "--port", "8080", "--grpc-port", "14", "--model", "/models/tiny",
                              "--host", "127.0.0.1", "--metrics-port", "19"}));
}

TEST(ClusterPlanTest, SitesTlsTokenAndExtraArgs) {
  LocalClusterOptions o;
  o.experts = 0;
  o.http_port = 9000;
  o.sites[NodeRole::kRouter].host = "::1";
  o.tls.ca = "/ca.pem";
  o.auth_token_file = "/token";
  o.extra_args[NodeRole::kRouter] = {"--x", "1"};
  ClusterPlanInputs in = Inputs({1, 2, 3, 4}, 0, {});
  in.http_port = 9000;
  const ClusterPlan plan = PlanCluster(o, in);
  ASSERT_EQ(plan.nodes.size(), 4u);
  const PlannedNode& router = plan.nodes[2];
  EXPECT_EQ(router.grpc_address, "[::1]:3");
  EXPECT_EQ(router.argv, (Args{"/bin/k3serve", "router", "--coordinator", "127.0.0.1:1", "--port",
                               "3", "--model", "/models/tiny", "--host", "::1", "--tls-ca",
                               "/ca.pem", "--x", "1"}));
  // The token goes to the nodes that face clients only.
  for (const PlannedNode& node : plan.nodes) {
    const bool has_token =
        std::find(node.argv.begin(), node.argv.end(), "--auth-token-file") != node.argv.end();
    EXPECT_EQ(has_token, node.role == NodeRole::kAttention || node.role == NodeRole::kHttp)
        << node.name;
  }
}

TEST(ClusterPlanTest, SpareSlotsSetByHandAreNotAddedAgain) {
  LocalClusterOptions o;
  o.experts = 2;
  o.extra_args[NodeRole::kCoordinator] = {"--spare-slots-per-worker", "1"};
  EXPECT_EQ(SpareExpertSlots(o, 8), 0);
  o.extra_args.clear();
  EXPECT_EQ(SpareExpertSlots(o, 9), 5);
  o.spare_expert_slots = 2;
  EXPECT_EQ(SpareExpertSlots(o, 9), 2);
  o.spare_expert_slots = -1;
  o.experts = 1;
  EXPECT_EQ(SpareExpertSlots(o, 9), 0);  // one node: nowhere to put replicas
}

TEST(ClusterPlanTest, ThreadsSplitAmongTheNodesOfThisMachine) {
  LocalClusterOptions o;
  o.attention = 1;
  o.routers = 1;
  o.experts = 2;
  ClusterPlanInputs in = Inputs({1, 2, 3, 4, 5}, 8, {4, 4});
  in.hardware_threads = 8;
  ClusterPlan plan = PlanCluster(o, in);
  EXPECT_EQ(plan.node_threads, 2);       // 8 threads among 4 data-plane nodes
  EXPECT_EQ(plan.attention_threads, 8);  // 8 among the one attention node
  in.hardware_threads = 3;
  o.attention = 2;
  in.ports = {1, 2, 3, 4, 5, 6};
  plan = PlanCluster(o, in);
  EXPECT_EQ(plan.node_threads, 1);  // 3 / 5 rounds to 0: at least 1
  EXPECT_EQ(plan.attention_threads, 1);
  o.node_threads = 5;
  plan = PlanCluster(o, in);
  EXPECT_EQ(plan.node_threads, 5);
  EXPECT_EQ(plan.attention_threads, 5);
}

TEST(ClusterPlanTest, ExpertSlotsDefaultToAnEvenShareAndBadOnesAreRejected) {
  LocalClusterOptions o;
  o.experts = 2;
  absl::StatusOr<std::vector<int>> slots = PlanExpertSlots(o, 9);
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_THAT(*slots, ElementsAre(5, 5));
  EXPECT_THAT(PlanExpertSlots(o, 0).status().message(), HasSubstr("0 routed experts"));
  o.expert_slots = {4, 4};
  EXPECT_THAT(PlanExpertSlots(o, 9).status().message(), HasSubstr("fewer than"));
  o.expert_slots = {9};
  EXPECT_THAT(PlanExpertSlots(o, 9).status().message(), HasSubstr("1 expert slot counts for 2"));
  o.expert_slots = {9, 0};
  EXPECT_THAT(PlanExpertSlots(o, 9).status().message(), HasSubstr("at least 1"));
  o.expert_slots = {};
  o.http_port = 70000;
  EXPECT_EQ(PlanExpertSlots(o, 9).status().code(), absl::StatusCode::kInvalidArgument);
  o.http_port = -1;
  o.routers = 0;
  EXPECT_EQ(CheckNodeCounts(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterPlanTest, ConsecutivePortsMustFitBelow65536) {
  LocalClusterOptions o;  // A1 R1 E1: 4 nodes
  o.base_port = 1000;
  absl::StatusOr<std::vector<int>> ports = ConsecutivePorts(o);
  ASSERT_TRUE(ports.ok()) << ports.status();
  EXPECT_THAT(*ports, ElementsAre(1000, 1001, 1002, 1003));
  o.base_port = 65532;  // 65532..65535
  EXPECT_TRUE(ConsecutivePorts(o).ok());
  o.base_port = 65533;  // the fourth would be 65536
  EXPECT_EQ(ConsecutivePorts(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
