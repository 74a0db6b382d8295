// The elastic expert tier (coordinator/coordinator.h) in real multi-process clusters (coordinator,
// one attention worker, routers and expert workers of //:k3serve over UCX, k3-tiny: 32 experts per
// MoE layer) under a steady load of greedy streams:
//  - scale up and drain: an expert node started while the cluster serves joins the placement
//    (its experts are loaded before any step is routed to it); an expert node sent SIGTERM, and
//    then one drained with the coordinator's Drain RPC, hand their experts to the others and exit
//    0. No request fails, every request's tokens equal the single-process engine's, and the
//    placement ends on the one node left;
//  - lost experts that can move: an expert worker killed with SIGKILL in a cluster without
//    replicas; the survivor has the slots for every expert, so the coordinator has it load the
//    dead worker's from the checkpoint, and the routers hold the steps that need them until then:
//    no request fails;
//  - lost experts that cannot move: the same with a survivor too small to hold them; the streams
//    end with UNAVAILABLE naming the dead worker and the cause, within 2 s of the kill (the
//    routers know from the cluster state that its death cannot be repaired).
#include <signal.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "proto/cluster.grpc.pb.h"
#include "tests/cluster_testing.h"
#include "tests/greedy_load.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr int kClients = 4;
constexpr int kMaxNewTokens = 24;
constexpr absl::Duration kRequestTimeout = absl::Seconds(30);
constexpr absl::Duration kWait = absl::Seconds(60);

class ElasticExpertsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 5));
    prompts_ = new std::vector<std::vector<int32_t>>(
        TestPrompts(2 * kClients, NamedConfig("k3-tiny")->vocab_size, 13));
    absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
        SingleProcessTokens(*model_, *prompts_, kMaxNewTokens);
    ASSERT_TRUE(expected.ok()) << expected.status();
    expected_ = new std::vector<std::vector<int32_t>>(*std::move(expected));
  }

  // `attention_args`: extra flags of the attention node.
  void Start(int routers, std::vector<int> slots, std::vector<std::string> attention_args = {}) {
    LocalClusterOptions options =
        TestClusterOptions(*model_, 1, routers, static_cast<int>(slots.size()), slots);
    options.extra_args[NodeRole::kAttention] = std::move(attention_args);
    // Old experts go soon after a switch, so that a drained node's are provably not needed.
    options.extra_args[NodeRole::kCoordinator] = {"--load-stats-interval-ms", "0",
                                                  "--retire-delay-ms", "200"};
    // Three clusters one after the other on a shared machine: a stop may take longer than 3 s.
    options.stop_grace = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      const absl::Status stopped = cluster_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
  }

  std::unique_ptr<GreedyLoad> StartLoad() {
    return std::make_unique<GreedyLoad>(cluster_->generate_addresses()[0], *prompts_, *expected_,
                                        kClients, kMaxNewTokens, kRequestTimeout);
  }

  pb::ClusterState State() {
    absl::StatusOr<pb::ClusterState> state = cluster_->GetClusterState(absl::Seconds(2));
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *state : pb::ClusterState();
  }

  // The node id of the running node called `name`; 0 if the coordinator does not list it.
  uint32_t NodeId(const std::string& name) {
    absl::StatusOr<const LocalCluster::Node*> node = cluster_->node(name);
    if (!node.ok()) return 0;
    const pb::ClusterState state = State();
    for (const pb::Member& m : state.members()) {
      if (m.node().pid() == (*node)->pid && m.state() == pb::ALIVE) return m.node().node_id();
    }
    return 0;
  }

  // Rows the expert node called `name` has computed (ExpertWorker.Status).
  int64_t RowsOf(const std::string& name) {
    absl::StatusOr<const LocalCluster::Node*> node = cluster_->node(name);
    if (!node.ok()) return -1;
    auto stub = pb::ExpertWorker::NewStub(
        grpc::CreateChannel((*node)->grpc_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    pb::ExpertStatusResponse status;
    const grpc::Status rpc = stub->Status(&context, pb::ExpertStatusRequest(), &status);
    EXPECT_TRUE(rpc.ok()) << name << ": " << rpc.error_message();
    return status.rows_processed();
  }

  // The placement's worker nodes, ascending.
  std::vector<uint32_t> Workers() {
    const pb::ClusterState state = State();
    std::vector<uint32_t> workers(state.placement().worker_node_ids().begin(),
                                  state.placement().worker_node_ids().end());
    std::sort(workers.begin(), workers.end());
    return workers;
  }
  static std::vector<uint32_t> Sorted(std::vector<uint32_t> nodes) {
    std::sort(nodes.begin(), nodes.end());
    return nodes;
  }

  // Waits until the placement's worker nodes are `want` (any order); returns how long that took.
  absl::Duration WaitWorkers(std::vector<uint32_t> want) {
    std::sort(want.begin(), want.end());
    const absl::Time start = absl::Now();
    EXPECT_TRUE(WaitFor([&] { return Workers() == want; }, kWait))
        << "worker nodes " << absl::StrJoin(Workers(), ",") << ", expected "
        << absl::StrJoin(want, ",");
    return absl::Now() - start;
  }

  static std::string* model_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<std::vector<int32_t>>* expected_;
  std::unique_ptr<LocalCluster> cluster_;
};

std::string* ElasticExpertsTest::model_ = nullptr;
std::vector<std::vector<int32_t>>* ElasticExpertsTest::prompts_ = nullptr;
std::vector<std::vector<int32_t>>* ElasticExpertsTest::expected_ = nullptr;

TEST_F(ElasticExpertsTest, ScaleUpAndDrainCostNoRequest) {
  // 16 + 16 slots for 32 experts; the joiner brings 32, so that it can end up alone.
  ASSERT_NO_FATAL_FAILURE(Start(/*routers=*/2, {16, 16}));
  const uint32_t e0 = NodeId("expert-0");
  const uint32_t e1 = NodeId("expert-1");
  ASSERT_EQ(Workers(), Sorted({e0, e1}));
  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  std::vector<std::string> summary;

  // Scale up: a third expert node joins the serving cluster.
  absl::StatusOr<std::string> joiner = cluster_->AddExpertNode(32);
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  uint32_t e2 = 0;
  ASSERT_TRUE(WaitFor([&] { return (e2 = NodeId(*joiner)) != 0; }, kWait));
  load->ResetLongestGap();
  int before = load->completed();
  const absl::Duration joined = WaitWorkers({e0, e1, e2});
  ASSERT_TRUE(load->WaitMore(2 * kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  // The placement names the joiner before every router has switched to it (the routers apply a
  // new placement version on their own time), so wait for its first rows rather than reading
  // them once: on a loaded host the old placement can serve the first requests after the join.
  int64_t joiner_rows = 0;
  EXPECT_TRUE(WaitFor([&] { return (joiner_rows = RowsOf(*joiner)) > 0; }, kWait))
      << "the joined node computed nothing";
  summary.push_back(absl::StrCat("join: node ", e2, " was a worker ",
                                 absl::FormatDuration(joined), " after it registered; ",
                                 load->completed() - before, " requests completed meanwhile (",
                                 joiner_rows, " rows computed by the new node), ",
                                 load->failed(), " failed; longest wait for a token ",
                                 absl::FormatDuration(load->longest_gap())));

  // Drain by SIGTERM: expert-0's experts move to the others, then it exits 0.
  load->ResetLongestGap();
  before = load->completed();
  const absl::Time term = absl::Now();
  ASSERT_TRUE(cluster_->Signal("expert-0", SIGTERM).ok());
  WaitWorkers({e1, e2});
  const absl::Duration moved = absl::Now() - term;
  absl::StatusOr<int> exit = cluster_->WaitExit("expert-0", kWait);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
  const absl::Duration exited = absl::Now() - term;
  ASSERT_TRUE(load->WaitMore(2 * kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  summary.push_back(absl::StrCat(
      "SIGTERM drain: experts moved after ", absl::FormatDuration(moved), ", node exited (",
      *exit, ") after ", absl::FormatDuration(exited), "; ", load->completed() - before,
      " requests completed, ", load->failed(), " failed; longest wait for a token ",
      absl::FormatDuration(load->longest_gap())));

  // Drain by the coordinator's Drain RPC: expert-1 goes the same way; expert-2 holds everything.
  load->ResetLongestGap();
  before = load->completed();
  const absl::Time drain = absl::Now();
  {
    auto stub = pb::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    pb::DrainRequest request;
    request.set_node_id(e1);
    pb::DrainResponse response;
    const grpc::Status status = stub->Drain(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  WaitWorkers({e2});
  exit = cluster_->WaitExit("expert-1", kWait);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 0);
  const absl::Duration drained = absl::Now() - drain;
  ASSERT_TRUE(load->WaitMore(2 * kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  summary.push_back(absl::StrCat("RPC drain: node exited (", *exit, ") after ",
                                 absl::FormatDuration(drained), "; ", load->completed() - before,
                                 " requests completed, ", load->failed(),
                                 " failed; longest wait for a token ",
                                 absl::FormatDuration(load->longest_gap())));

  load->Stop();
  EXPECT_EQ(load->failed(), 0) << absl::StrJoin(load->failures(), "\n");
  const pb::ClusterState state = State();
  EXPECT_TRUE(state.ready()) << state.not_ready_reason();
  summary.push_back(absl::StrCat(load->completed(), " requests in all, ", load->failed(),
                                 " failed; placement version ", state.placement().version()));
  const std::string text = absl::StrJoin(summary, "\n");
  std::cout << text << std::endl;
  RecordProperty("summary", text);
}

// A1/R1/E2 without replicas; the survivor's 32 slots can take every expert.
TEST_F(ElasticExpertsTest, LostExpertsMoveOntoTheSurvivorAndTheStepsResume) {
  ASSERT_NO_FATAL_FAILURE(Start(/*routers=*/1, {32, 32}));
  const uint32_t e0 = NodeId("expert-0");
  const uint32_t e1 = NodeId("expert-1");
  ASSERT_EQ(Workers(), Sorted({e0, e1}));
  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  load->ResetLongestGap();
  const int before = load->completed();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster_->Signal("expert-1", SIGKILL).ok());
  WaitWorkers({e0});
  const absl::Duration moved = absl::Now() - killed;
  ASSERT_TRUE(load->WaitMore(2 * kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  load->Stop();
  EXPECT_EQ(load->failed(), 0) << absl::StrJoin(load->failures(), "\n");
  const std::string text = absl::StrCat(
      "lost experts moved onto the survivor ", absl::FormatDuration(moved), " after the kill; ",
      load->completed() - before, " requests completed since, ", load->failed(),
      " failed; longest wait for a token ", absl::FormatDuration(load->longest_gap()));
  std::cout << text << std::endl;
  RecordProperty("summary", text);
  const pb::ClusterState state = State();
  EXPECT_TRUE(state.ready()) << state.not_ready_reason();
  EXPECT_EQ(cluster_->WaitExit("expert-1", absl::Seconds(1)).value_or(0), 128 + SIGKILL);
}

// A1/R1/E2 without replicas; the survivor's 16 slots cannot take the other 16 experts.
TEST_F(ElasticExpertsTest, LostExpertsThatCannotMoveEndTheStreamsNamingTheCause) {
  // The layers wait for a restarted worker (none comes here) for 1 s, not the default 30 s.
  ASSERT_NO_FATAL_FAILURE(Start(/*routers=*/1, {16, 16}, {"--moe-timeout-ms", "1000"}));
  const uint32_t e1 = NodeId("expert-1");
  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster_->Signal("expert-1", SIGKILL).ok());
  ASSERT_TRUE(load->WaitFailed(absl::Seconds(10)));
  const absl::Duration ended = load->first_failure() - killed;
  load->Stop();
  const std::vector<std::string> failures = load->failures();
  const std::string text = absl::StrCat("the first stream ended ", absl::FormatDuration(ended),
                                        " after the kill: ", failures[0]);
  std::cout << text << std::endl;
  RecordProperty("summary", text);
  EXPECT_LT(ended, absl::Seconds(3));
  for (const std::string& failure : failures) {
    EXPECT_NE(failure.find("UNAVAILABLE"), std::string::npos) << failure;
    EXPECT_NE(failure.find(absl::StrCat("expert worker node ", e1)), std::string::npos) << failure;
    EXPECT_NE(failure.find("the coordinator cannot move its experts: "), std::string::npos)
        << failure;
    EXPECT_NE(failure.find("offer 16 slots per MoE layer for 32 experts"), std::string::npos)
        << failure;
  }
}

// A1/R1/E2 without replicas: SIGTERM to an expert worker asks the coordinator to drain it, which
// cannot (the other's 16 slots cannot take 32 experts); the drain is refused, the node keeps
// serving its experts, and no request fails. A second SIGTERM is refused the same way.
TEST_F(ElasticExpertsTest, ADrainThatWouldLoseExpertsIsRefusedAndTheNodeKeepsServing) {
  ASSERT_NO_FATAL_FAILURE(Start(/*routers=*/1, {16, 16}));
  const uint32_t e1 = NodeId("expert-1");
  const std::vector<uint32_t> workers = Workers();
  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  for (int attempt = 0; attempt < 2; ++attempt) {
    ASSERT_TRUE(cluster_->Signal("expert-1", SIGTERM).ok());
    // Still running well past a drain's quiet second, and still a worker.
    EXPECT_FALSE(cluster_->WaitExit("expert-1", absl::Seconds(4)).ok());
  }
  EXPECT_EQ(Workers(), workers);
  const pb::ClusterState state = State();
  for (const pb::Member& m : state.members()) {
    if (m.node().node_id() == e1) {
      EXPECT_FALSE(m.draining());
    }
  }
  ASSERT_TRUE(load->WaitMore(2 * kClients, kWait)) << absl::StrJoin(load->failures(), "\n");
  load->Stop();
  EXPECT_EQ(load->failed(), 0) << absl::StrJoin(load->failures(), "\n");
  EXPECT_TRUE(State().ready());
}

}  // namespace
}  // namespace k3
