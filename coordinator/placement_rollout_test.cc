// PlacementRollout over real gRPC on localhost: expert-worker stand-ins that see the placement
// version an in-process PlacementControl has committed and record what they are asked, and a
// router member whose heartbeats (in that control's cluster state) report the committed version.
#include "coordinator/placement_rollout.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/grpc_server.h"
#include "cluster/test_wait.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

std::vector<int> Ids(const pb::LayerExperts& layer) {
  return {layer.expert_ids().begin(), layer.expert_ids().end()};
}

TEST(LoadExpertsRequestForTest, ListsTheWorkersExpertsOfEveryLayer) {
  ClusterPlacement placement;
  placement.experts.version = 6;
  placement.experts.num_workers = 2;
  placement.experts.num_experts = 3;
  // Layer 0: expert 2 on both workers; layer 1: worker 1 holds experts 0 and 2.
  placement.experts.hosts = {{{0}, {1}, {0, 1}}, {{1}, {0}, {1}}};
  placement.worker_nodes = {5, 8};
  const pb::LoadExpertsRequest zero = LoadExpertsRequestFor(placement, 0, 0, 5);
  EXPECT_EQ(zero.placement_version(), 6);
  EXPECT_EQ(zero.worker(), 0);
  EXPECT_EQ(zero.retire_below_version(), 0);
  EXPECT_EQ(zero.committed_version(), 5);
  ASSERT_EQ(zero.experts_size(), 2);
  EXPECT_EQ(zero.experts(0).layer(), 0);
  EXPECT_EQ(Ids(zero.experts(0)), (std::vector<int>{0, 2}));
  EXPECT_EQ(zero.experts(1).layer(), 1);
  EXPECT_EQ(Ids(zero.experts(1)), (std::vector<int>{1}));
  const pb::LoadExpertsRequest one = LoadExpertsRequestFor(placement, 1, 6, 6);
  EXPECT_EQ(one.worker(), 1);
  EXPECT_EQ(one.retire_below_version(), 6);
  ASSERT_EQ(one.experts_size(), 2);
  EXPECT_EQ(Ids(one.experts(0)), (std::vector<int>{1, 2}));
  EXPECT_EQ(Ids(one.experts(1)), (std::vector<int>{0, 2}));
}

// The coordinator's state, in process: the members the test adds and the committed placement.
class FakeControl final : public PlacementControl {
 public:
  void AddMember(uint32_t node, pb::Role role, const std::string& address) {
    absl::MutexLock lock(&mu_);
    pb::Member* m = state_.add_members();
    m->mutable_node()->set_node_id(node);
    m->mutable_node()->set_role(role);
    m->mutable_node()->set_grpc_address(address);
    m->set_state(pb::ALIVE);
  }
  void Place(const ClusterPlacement& placement) {
    absl::MutexLock lock(&mu_);
    ClusterPlacementToProto(placement, state_.mutable_placement());
  }
  int64_t version() const {
    absl::MutexLock lock(&mu_);
    return state_.placement().version();
  }
  std::vector<std::pair<ClusterPlacement, int64_t>> commits() const {
    absl::MutexLock lock(&mu_);
    return commits_;
  }
  absl::Time committed_at() const {
    absl::MutexLock lock(&mu_);
    return committed_at_;
  }

  // The routers' heartbeats report the committed version, or at most `version` while held.
  void HoldRouters(int64_t version) { routers_held_ = version; }
  void ReleaseRouters() { routers_held_ = INT64_MAX; }

  absl::StatusOr<pb::ClusterState> ClusterStateSnapshot(absl::Time) override {
    absl::MutexLock lock(&mu_);
    pb::ClusterState state = state_;
    for (pb::Member& m : *state.mutable_members()) {
      if (m.node().role() != pb::ROLE_ROUTER) continue;
      m.set_applied_placement_version(std::min<int64_t>(state.placement().version(),
                                                        routers_held_));
    }
    return state;
  }
  absl::StatusOr<int64_t> ReservePlacementVersion(int64_t, absl::Time) override {
    return absl::UnimplementedError("not the rollout's business");
  }
  absl::Status CommitPlacement(const ClusterPlacement& placement, int64_t base_version,
                               absl::Time) override {
    absl::MutexLock lock(&mu_);
    commits_.emplace_back(placement, base_version);
    committed_at_ = absl::Now();
    ClusterPlacementToProto(placement, state_.mutable_placement());
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<CoordinatorState::Resize>> PlanResize(absl::Time) override {
    return absl::UnimplementedError("not the rollout's business");
  }
  void ResizeFailed(int64_t, const absl::Status&) override {}

 private:
  mutable absl::Mutex mu_;
  pb::ClusterState state_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<ClusterPlacement, int64_t>> commits_ ABSL_GUARDED_BY(mu_);
  absl::Time committed_at_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> routers_held_{INT64_MAX};
};

// Records every LoadExperts with the version committed when it came; fails them if told to.
class Worker final : public pb::ExpertWorker::CallbackService {
 public:
  struct Call {
    pb::LoadExpertsRequest request;
    int64_t committed = 0;
    absl::Time time;
  };
  explicit Worker(const FakeControl* control) : control_(control) {}

  void set_failing(bool failing) { failing_ = failing; }
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  grpc::ServerUnaryReactor* LoadExperts(grpc::CallbackServerContext* context,
                                        const pb::LoadExpertsRequest* request,
                                        pb::LoadExpertsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back({*request, control_->version(), absl::Now()});
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (failing_) {
      reactor->Finish(grpc::Status(grpc::UNAVAILABLE, "disk on fire"));
    } else {
      response->set_placement_version(request->placement_version());
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

 private:
  const FakeControl* const control_;
  std::atomic<bool> failing_{false};
  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

constexpr uint32_t kWorkerNodes[] = {11, 12};
constexpr uint32_t kRouterNode = 21;

// Placement version 1 on expert nodes 11 and 12 (one expert each, two layers) and a router;
// the rollouts move to version 2 with the workers swapped.
class RolloutTest : public testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t node : kWorkerNodes) {
      workers_.push_back(std::make_unique<Worker>(&control_));
      control_.AddMember(node, pb::ROLE_EXPERT, Serve(workers_.back().get()));
    }
    control_.AddMember(kRouterNode, pb::ROLE_ROUTER, "127.0.0.1:1");  // only its heartbeats count
    control_.Place(Placement(1, {11, 12}));
  }
  void TearDown() override {
    calls_.Stop();
    actor_.Stop();
    for (auto& server : servers_) server->Shutdown(absl::ZeroDuration());
  }

  std::string Serve(grpc::Service* service) {
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {service});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "127.0.0.1:1";
    servers_.push_back(*std::move(server));
    return absl::StrCat("127.0.0.1:", servers_.back()->port());
  }

  // Worker w holds expert w of both layers.
  static ClusterPlacement Placement(int64_t version, std::vector<uint32_t> nodes) {
    ClusterPlacement placement;
    placement.experts.version = version;
    placement.experts.num_workers = 2;
    placement.experts.num_experts = 2;
    placement.experts.hosts = {{{0}, {1}}, {{0}, {1}}};
    placement.worker_nodes = std::move(nodes);
    return placement;
  }

  // Starts the rollout on the actor and waits for its outcome.
  absl::Status RollOut(const ClusterPlacement& next) {
    auto outcome = std::make_shared<std::pair<absl::Notification, absl::Status>>();
    const absl::Status started = actor_.Call(
        [this, next, outcome] {
          absl::StatusOr<pb::ClusterState> state = control_.ClusterStateSnapshot(absl::Now());
          rollout_.RollOut(next, 1, *state, "the test's placement", [outcome](absl::Status s) {
            outcome->second = std::move(s);
            outcome->first.Notify();
          });
          return absl::OkStatus();
        },
        absl::Now() + absl::Seconds(30));
    if (!started.ok()) return started;
    if (!outcome->first.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      return absl::DeadlineExceededError("the rollout did not end within 30 s");
    }
    return outcome->second;
  }

  RolloutTimeouts timeouts_{.rpc_timeout = absl::Seconds(2),
                            .load_timeout = absl::Seconds(5),
                            .switch_timeout = absl::Milliseconds(300),
                            .retire_delay = absl::Milliseconds(50)};
  FakeControl control_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  RpcFanOut calls_{ClientTls()};
  Actor actor_{"rollout"};
  PlacementRollout rollout_{timeouts_, &control_, &calls_, &actor_};
};

TEST_F(RolloutTest, LoadsEveryWorkerBeforeCommittingAndRetiresOnceTheRoutersSwitched) {
  const ClusterPlacement next = Placement(2, {12, 11});
  ASSERT_TRUE(RollOut(next).ok());
  const auto commits = control_.commits();
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].first, next);
  EXPECT_EQ(commits[0].second, 1);

  ASSERT_TRUE(WaitFor([&] {
    return workers_[0]->calls().size() >= 2 && workers_[1]->calls().size() >= 2;
  }));
  for (int node = 0; node < 2; ++node) {
    const std::vector<Worker::Call> calls = workers_[node]->calls();
    ASSERT_EQ(calls.size(), 2u) << "node " << kWorkerNodes[node];
    const int worker = 1 - node;  // node 12 is worker 0 of version 2
    // The load, while version 1 was still the committed one.
    EXPECT_EQ(calls[0].request.placement_version(), 2);
    EXPECT_EQ(calls[0].request.worker(), worker);
    EXPECT_EQ(calls[0].request.retire_below_version(), 0);
    EXPECT_EQ(calls[0].committed, 1);
    ASSERT_EQ(calls[0].request.experts_size(), 2);
    EXPECT_EQ(Ids(calls[0].request.experts(1)), std::vector<int>{worker});
    // The retirement, retire_delay after the commit.
    EXPECT_EQ(calls[1].request.placement_version(), 2);
    EXPECT_EQ(calls[1].request.worker(), worker);
    EXPECT_EQ(calls[1].request.retire_below_version(), 2);
    EXPECT_GE(calls[1].time - control_.committed_at(), timeouts_.retire_delay);
  }
}

// RollOut returns once the placement is committed (nothing waits on the balancer's actor); old
// experts go only once the lagging router reported the new version.
TEST_F(RolloutTest, RetiresOnlyAfterALaggingRouterSwitched) {
  control_.HoldRouters(1);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(RollOut(Placement(2, {11, 12})).ok());
  EXPECT_LT(absl::Now() - start, timeouts_.switch_timeout) << "RollOut waited for the router";
  ASSERT_EQ(control_.commits().size(), 1u);
  // The claim is that nothing happens meanwhile: past the switch timeout and the first retirement
  // attempt, the workers were asked only to load.
  absl::SleepFor(timeouts_.switch_timeout + 2 * timeouts_.retire_delay);
  EXPECT_EQ(workers_[0]->calls().size(), 1u) << "retired while a router still used version 1";
  const absl::Time released = absl::Now();
  control_.ReleaseRouters();
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->calls().size() >= 2; }));
  const std::vector<Worker::Call> calls = workers_[0]->calls();
  EXPECT_EQ(calls[1].request.retire_below_version(), 2);
  EXPECT_GE(calls[1].time, released) << "retired while a router still used version 1";
}

TEST_F(RolloutTest, AFailedLoadAbandonsTheRolloutWithoutCommitting) {
  workers_[1]->set_failing(true);
  const absl::Status status = RollOut(Placement(2, {11, 12}));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("the test's placement abandoned"), std::string::npos) << status;
  EXPECT_NE(status.message().find("expert node 12 (worker 1)"), std::string::npos) << status;
  EXPECT_NE(status.message().find("disk on fire"), std::string::npos) << status;
  EXPECT_TRUE(control_.commits().empty());
  EXPECT_EQ(control_.version(), 1);
  EXPECT_EQ(workers_[0]->calls().size(), 1u);  // it was asked to load all the same
}

TEST_F(RolloutTest, AWorkerNodeOutsideTheClusterAbortsBeforeAnyLoad) {
  const absl::Status status = RollOut(Placement(2, {11, 99}));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_NE(status.message().find("worker node 99"), std::string::npos) << status;
  EXPECT_TRUE(control_.commits().empty());
  EXPECT_TRUE(workers_[0]->calls().empty());
  EXPECT_TRUE(workers_[1]->calls().empty());
}

}  // namespace
}  // namespace k3
