// Faults that must cost no request, in a real multi-process cluster (coordinator, one attention
// worker, two routers, two expert workers of //:k3serve over UCX, k3-tiny) under a steady load of
// greedy streams:
//  - the coordinator killed with SIGKILL and restarted with the same flags on the same port: the
//    streams keep completing while it is down and after it is back; the restarted coordinator
//    relearns the members (same ids, same processes) and the placement (same version) from the
//    nodes;
//  - a router hung with SIGSTOP: the attention worker sends the MoE layer it waits for to the other
//    router once the step deadline (derived from measured step times, far below the 10 s MoE
//    timeout) passes, and new layers avoid the hung router; streams stall for well under 2 s.
//    The coordinator marks it DEAD, and ALIVE again after SIGCONT.
//  - an expert worker killed with SIGKILL in a cluster whose spare slots hold a replica of every
//    expert (A1/R1/E2, --spare-slots-per-worker): the router sends the dead worker's rows to the
//    live replica, so the streams go on;
//  - an expert worker hung with SIGSTOP in the same cluster: the router sends the rows it owes to
//    the live replica once the expert deadline (derived from measured expert round trips, far
//    below the router's 5 s step timeout) passes, and new steps avoid it; streams stall for well
//    under 2 s.
// In every case no request fails and every request's tokens equal the single-process engine's.
#include <signal.h>

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "proto/cluster.pb.h"
#include "tests/cluster_testing.h"
#include "tests/greedy_load.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr int kClients = 4;
constexpr int kMaxNewTokens = 24;
constexpr absl::Duration kRequestTimeout = absl::Seconds(30);

// The state the coordinator gives the member with `pid`; MEMBER_STATE_UNSPECIFIED if unknown.
pb::MemberState StateOfPid(const LocalCluster& cluster, pid_t pid) {
  absl::StatusOr<pb::ClusterState> state = cluster.GetClusterState(absl::Seconds(1));
  if (!state.ok()) return pb::MEMBER_STATE_UNSPECIFIED;
  for (const pb::Member& m : state->members()) {
    if (m.node().pid() == pid) return m.state();
  }
  return pb::MEMBER_STATE_UNSPECIFIED;
}

// (node id, incarnation) of each member, with its state.
std::map<std::pair<uint32_t, uint64_t>, pb::MemberState> Members(const pb::ClusterState& state) {
  std::map<std::pair<uint32_t, uint64_t>, pb::MemberState> members;
  for (const pb::Member& m : state.members()) {
    members[{m.node().node_id(), m.node().incarnation()}] = m.state();
  }
  return members;
}

class ClusterFailoverTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 5));
    prompts_ = new std::vector<std::vector<int32_t>>(
        TestPrompts(2 * kClients, NamedConfig("k3-tiny")->vocab_size, 11));
    absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
        SingleProcessTokens(*model_, *prompts_, kMaxNewTokens);
    if (!expected.ok()) {
      start_error_ = new std::string(expected.status().ToString());
      return;
    }
    expected_ = new std::vector<std::vector<int32_t>>(*std::move(expected));
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::Start(TestClusterOptions(*model_, 1, 2, 2));
    if (!cluster.ok()) {
      start_error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = cluster->release();
  }

  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      const absl::Status stopped = cluster_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << *start_error_;
    const absl::Status running = cluster_->CheckRunning();
    ASSERT_TRUE(running.ok()) << running;
  }

  std::unique_ptr<GreedyLoad> StartLoad() {
    return std::make_unique<GreedyLoad>(cluster_->generate_addresses()[0], *prompts_, *expected_,
                                        kClients, kMaxNewTokens, kRequestTimeout);
  }

  static std::string* model_;
  static std::string* start_error_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<std::vector<int32_t>>* expected_;
  static LocalCluster* cluster_;
};

std::string* ClusterFailoverTest::model_ = nullptr;
std::string* ClusterFailoverTest::start_error_ = nullptr;
std::vector<std::vector<int32_t>>* ClusterFailoverTest::prompts_ = nullptr;
std::vector<std::vector<int32_t>>* ClusterFailoverTest::expected_ = nullptr;
LocalCluster* ClusterFailoverTest::cluster_ = nullptr;

TEST_F(ClusterFailoverTest, CoordinatorRestartIsANonEvent) {
  absl::StatusOr<pb::ClusterState> before = cluster_->GetClusterState(absl::Seconds(2));
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(before->ready()) << before->not_ready_reason();
  ASSERT_EQ(before->members_size(), 5);

  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, absl::Seconds(30))) << absl::StrJoin(load->failures(), "\n");

  ASSERT_TRUE(cluster_->Signal("coordinator", SIGKILL).ok());
  absl::StatusOr<int> exit = cluster_->WaitExit("coordinator", absl::Seconds(5));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_EQ(*exit, 128 + SIGKILL);
  // The data plane serves without a coordinator: several heartbeat timeouts' worth of requests.
  const absl::Time down = absl::Now();
  EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");
  EXPECT_TRUE(WaitFor([&] { return absl::Now() - down > absl::Seconds(2); }, absl::Seconds(3)));
  EXPECT_TRUE(load->WaitMore(kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");

  // Same flags, same port. It relearns every member (same ids, same processes, ALIVE) and the
  // placement from the nodes, and is ready again.
  ASSERT_TRUE(cluster_->Restart("coordinator").ok());
  const absl::Time restarted = absl::Now();
  absl::StatusOr<pb::ClusterState> after;
  const bool relearned = WaitFor(
      [&] {
        after = cluster_->GetClusterState(absl::Seconds(1));
        return after.ok() && after->ready() && !after->recovering() &&
               Members(*after) == Members(*before);
      },
      absl::Seconds(20));
  ASSERT_TRUE(relearned) << (after.ok() ? after->DebugString() : after.status().ToString());
  std::cerr << "the restarted coordinator relearned the cluster in "
            << absl::FormatDuration(absl::Now() - restarted) << std::endl;
  EXPECT_EQ(after->placement().SerializeAsString(), before->placement().SerializeAsString())
      << "before: " << before->placement().ShortDebugString()
      << "\nafter: " << after->placement().ShortDebugString();

  // Requests keep succeeding after it is back, on links the nodes kept.
  EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");
  load->Stop();
  EXPECT_EQ(load->failed(), 0) << absl::StrJoin(load->failures(), "\n");
  std::cerr << load->completed() << " requests completed, " << load->failed()
            << " failed; longest wait for a token: " << absl::FormatDuration(load->longest_gap())
            << std::endl;
  const absl::Status running = cluster_->CheckRunning();
  EXPECT_TRUE(running.ok()) << running;
}

TEST_F(ClusterFailoverTest, AHungRouterIsRoutedAroundWithinTwoSeconds) {
  absl::StatusOr<const LocalCluster::Node*> router = cluster_->node("router-0");
  ASSERT_TRUE(router.ok()) << router.status();
  const pid_t pid = (*router)->pid;
  std::unique_ptr<GreedyLoad> load = StartLoad();
  ASSERT_TRUE(load->WaitMore(kClients, absl::Seconds(30))) << absl::StrJoin(load->failures(), "\n");

  ASSERT_TRUE(cluster_->Signal("router-0", SIGSTOP).ok());
  struct Continue {
    ~Continue() { (void)cluster->Signal("router-0", SIGCONT); }
    LocalCluster* cluster;
  } resume_at_exit{cluster_};
  load->ResetLongestGap();
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");
  // The coordinator's verdict, and requests keep completing after it.
  EXPECT_TRUE(WaitFor([&] { return StateOfPid(*cluster_, pid) == pb::DEAD; }, absl::Seconds(5)));
  std::cerr << "the coordinator marked the hung router DEAD after "
            << absl::FormatDuration(absl::Now() - stopped) << std::endl;
  EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");
  const absl::Duration stall = load->longest_gap();
  std::cerr << "longest wait for a token while the router was hung: "
            << absl::FormatDuration(stall) << std::endl;
  EXPECT_LT(stall, absl::Seconds(2)) << "the hung router was not routed around in time";

  // Running again, it is ALIVE again and the cluster keeps serving.
  ASSERT_TRUE(cluster_->Signal("router-0", SIGCONT).ok());
  EXPECT_TRUE(WaitFor([&] { return StateOfPid(*cluster_, pid) == pb::ALIVE; }, absl::Seconds(5)));
  EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load->failures(), "\n");
  load->Stop();
  EXPECT_EQ(load->failed(), 0) << absl::StrJoin(load->failures(), "\n");
  std::cerr << load->completed() << " requests completed, " << load->failed() << " failed"
            << std::endl;
  const absl::Status running = cluster_->CheckRunning();
  EXPECT_TRUE(running.ok()) << running;
}

// A1/R1/E2 of k3-tiny (32 experts, 16 slots each) with 16 spare slots per worker: each expert
// worker holds its share and a replica of the other's.
class ExpertReplicaFailoverTest : public testing::Test {
 protected:
  void SetUp() override {
    model_ = RandomCheckpointDir("k3-tiny", 5);
    prompts_ = TestPrompts(2 * kClients, NamedConfig("k3-tiny")->vocab_size, 11);
    absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
        SingleProcessTokens(model_, prompts_, kMaxNewTokens);
    ASSERT_TRUE(expected.ok()) << expected.status();
    expected_ = *std::move(expected);
    LocalClusterOptions options = TestClusterOptions(model_, 1, 1, 2);
    options.extra_args[NodeRole::kCoordinator] = {"--spare-slots-per-worker", "16"};
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      // The killed expert stays dead; the rest must stop cleanly.
      const absl::Status stopped = cluster_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
  }

  std::string model_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::vector<int32_t>> expected_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ExpertReplicaFailoverTest, AKilledExpertWorkerCostsNoRequest) {
  absl::StatusOr<pb::ClusterState> state = cluster_->GetClusterState(absl::Seconds(2));
  ASSERT_TRUE(state.ok()) << state.status();
  // Every expert of every MoE layer has two hosts.
  for (const auto& layer : state->placement().layers()) {
    for (const auto& expert : layer.experts()) {
      ASSERT_EQ(expert.workers_size(), 2) << state->placement().ShortDebugString();
    }
  }
  GreedyLoad load(cluster_->generate_addresses()[0], prompts_, expected_, kClients,
                  kMaxNewTokens, kRequestTimeout);
  ASSERT_TRUE(load.WaitMore(kClients, absl::Seconds(30))) << absl::StrJoin(load.failures(), "\n");

  load.ResetLongestGap();
  ASSERT_TRUE(cluster_->Signal("expert-1", SIGKILL).ok());
  const absl::Time killed = absl::Now();
  const int before = load.completed();
  EXPECT_TRUE(load.WaitMore(1, absl::Seconds(30))) << absl::StrJoin(load.failures(), "\n");
  std::cerr << "first request completed " << absl::FormatDuration(absl::Now() - killed)
            << " after the kill" << std::endl;
  EXPECT_TRUE(load.WaitMore(3 * kClients, absl::Seconds(60)))
      << absl::StrJoin(load.failures(), "\n");
  load.Stop();
  absl::StatusOr<int> exit = cluster_->WaitExit("expert-1", absl::Seconds(2));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 128 + SIGKILL);
  EXPECT_EQ(load.failed(), 0) << absl::StrJoin(load.failures(), "\n");
  std::cerr << load.completed() - before << " requests completed after the kill, " << load.failed()
            << " failed; longest wait for a token: " << absl::FormatDuration(load.longest_gap())
            << std::endl;
  EXPECT_LT(load.longest_gap(), absl::Seconds(2));
  // Nothing else died.
  for (const LocalCluster::Node* node : cluster_->Reap()) {
    if (node->name != "expert-1") ADD_FAILURE() << node->name << " exited";
  }
}

TEST_F(ExpertReplicaFailoverTest, AHungExpertWorkerIsRoutedAroundWithinTwoSeconds) {
  absl::StatusOr<const LocalCluster::Node*> expert = cluster_->node("expert-0");
  ASSERT_TRUE(expert.ok()) << expert.status();
  const pid_t pid = (*expert)->pid;
  GreedyLoad load(cluster_->generate_addresses()[0], prompts_, expected_, kClients,
                  kMaxNewTokens, kRequestTimeout);
  // Enough answered steps for the router to measure its expert round trips.
  ASSERT_TRUE(load.WaitMore(2 * kClients, absl::Seconds(60)))
      << absl::StrJoin(load.failures(), "\n");

  ASSERT_TRUE(cluster_->Signal("expert-0", SIGSTOP).ok());
  struct Continue {
    ~Continue() { (void)cluster->Signal("expert-0", SIGCONT); }
    LocalCluster* cluster;
  } resume_at_exit{cluster_.get()};
  load.ResetLongestGap();
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(load.WaitMore(1, absl::Seconds(30))) << absl::StrJoin(load.failures(), "\n");
  std::cerr << "first request completed " << absl::FormatDuration(absl::Now() - stopped)
            << " after the SIGSTOP" << std::endl;
  EXPECT_TRUE(load.WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load.failures(), "\n");
  EXPECT_TRUE(WaitFor([&] { return StateOfPid(*cluster_, pid) == pb::DEAD; }, absl::Seconds(5)));
  EXPECT_TRUE(load.WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load.failures(), "\n");
  const absl::Duration stall = load.longest_gap();
  std::cerr << "longest wait for a token while the expert worker was hung: "
            << absl::FormatDuration(stall) << std::endl;
  EXPECT_LT(stall, absl::Seconds(2)) << "the hung expert worker was not routed around in time";
  // Before the coordinator's DEAD verdict (1.5 s of silent heartbeats), which alone would also
  // end the stall: the router's own expert deadline did it.
  EXPECT_LT(stall, absl::Milliseconds(1250)) << "only the DEAD verdict ended the stall";

  // Running again, it is ALIVE again and the cluster keeps serving.
  ASSERT_TRUE(cluster_->Signal("expert-0", SIGCONT).ok());
  EXPECT_TRUE(WaitFor([&] { return StateOfPid(*cluster_, pid) == pb::ALIVE; }, absl::Seconds(5)));
  EXPECT_TRUE(load.WaitMore(2 * kClients, absl::Seconds(30)))
      << absl::StrJoin(load.failures(), "\n");
  load.Stop();
  EXPECT_EQ(load.failed(), 0) << absl::StrJoin(load.failures(), "\n");
  std::cerr << load.completed() << " requests completed, " << load.failed() << " failed"
            << std::endl;
  const absl::Status running = cluster_->CheckRunning();
  EXPECT_TRUE(running.ok()) << running;
}

}  // namespace
}  // namespace k3
