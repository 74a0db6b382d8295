// The coordinator's load balancer over real gRPC on localhost: a CoordinatorProcess with fake
// routers (RouterControl) and fake expert nodes (ExpertWorker) that record what they are asked.
#include "coordinator/coordinator_balancer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/coordinator_main.h"
#include "coordinator/expert_placement_planner.h"
#include "cluster/grpc_server.h"
#include "cluster/metrics.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"
#include "moe/qb_statistics.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr int kLayers = 2;
constexpr int kExperts = 8;
constexpr int kTopK = 2;
constexpr absl::Duration kRpcTimeout = absl::Seconds(5);

std::unique_ptr<pb::Coordinator::Stub> CoordinatorStub(const std::string& address) {
  return pb::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

int64_t PublishedVersion(pb::Coordinator::Stub* stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  pb::ClusterState state;
  if (!stub->GetClusterState(&context, {}, &state).ok()) return -1;
  return state.placement().version();
}

// A router's control service: answers GetLoadStats with a window set by the test (handed out
// once, on a reset), reports the coordinator's current placement version as its own with a
// heartbeat (it "switches" as soon as the version is published; its own thread watches), and
// records SetBias calls.
class FakeRouter final : public pb::RouterControl::Service {
 public:
  explicit FakeRouter(const std::string& coordinator)
      : coordinator_(CoordinatorStub(coordinator)) {}
  ~FakeRouter() {
    stop_.Notify();
    if (watcher_.joinable()) watcher_.join();
  }

  // Registered as node `node_id` with `incarnation`: from now on it reports what it uses.
  void Registered(uint32_t node_id, uint64_t incarnation) {
    watcher_ = std::thread([this, node_id, incarnation] {
      int64_t reported = 0;
      while (!stop_.HasBeenNotified()) {
        const int64_t version = PublishedVersion(coordinator_.get());
        if (version > reported && Heartbeat(node_id, incarnation, version)) {
          reported = version;
          absl::MutexLock lock(&mu_);
          switched_.emplace(version, absl::Now());
        }
        // A router learns a new version from its next heartbeat, as a real one does; this is its
        // heartbeat interval, cut short when the test ends.
        stop_.WaitForNotificationWithTimeout(absl::Milliseconds(5));
      }
    });
  }

  void SetWindow(pb::LoadStatsResponse window) {
    absl::MutexLock lock(&mu_);
    window_ = std::move(window);
  }
  std::vector<bool> resets() const {
    absl::MutexLock lock(&mu_);
    return resets_;
  }
  // When this router first reported each placement version.
  std::map<int64_t, absl::Time> switched() const {
    absl::MutexLock lock(&mu_);
    return switched_;
  }
  std::vector<pb::SetBiasRequest> biases() const {
    absl::MutexLock lock(&mu_);
    return biases_;
  }

  grpc::Status GetLoadStats(grpc::ServerContext*, const pb::GetLoadStatsRequest* request,
                            pb::LoadStatsResponse* response) override {
    const int64_t version = PublishedVersion(coordinator_.get());
    absl::MutexLock lock(&mu_);
    response->set_placement_version(version);
    resets_.push_back(request->reset());
    *response->mutable_layers() = window_.layers();
    if (request->reset()) window_.Clear();
    return grpc::Status::OK;
  }

  grpc::Status SetBias(grpc::ServerContext*, const pb::SetBiasRequest* request,
                       pb::SetBiasResponse*) override {
    absl::MutexLock lock(&mu_);
    biases_.push_back(*request);
    return grpc::Status::OK;
  }

 private:
  bool Heartbeat(uint32_t node_id, uint64_t incarnation, int64_t version) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::HeartbeatRequest request;
    request.set_node_id(node_id);
    request.set_incarnation(incarnation);
    request.set_applied_placement_version(version);
    pb::HeartbeatResponse response;
    return coordinator_->Heartbeat(&context, request, &response).ok();
  }

  const std::unique_ptr<pb::Coordinator::Stub> coordinator_;
  absl::Notification stop_;  // the test is over: the watcher returns
  std::thread watcher_;
  mutable absl::Mutex mu_;
  pb::LoadStatsResponse window_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> resets_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::Time> switched_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::SetBiasRequest> biases_ ABSL_GUARDED_BY(mu_);
};

// An expert node's control service: records every LoadExperts with the placement version the
// coordinator had published when it arrived; can fail or hang (until cancelled) instead.
class FakeWorker final : public pb::ExpertWorker::Service {
 public:
  enum class Mode { kOk, kFail, kHang };
  struct Call {
    pb::LoadExpertsRequest request;
    int64_t published = 0;
    absl::Time time;
  };

  explicit FakeWorker(const std::string& coordinator)
      : coordinator_(CoordinatorStub(coordinator)) {}

  void set_mode(Mode mode) {
    absl::MutexLock lock(&mu_);
    mode_ = mode;
  }
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  grpc::Status LoadExperts(grpc::ServerContext* context, const pb::LoadExpertsRequest* request,
                           pb::LoadExpertsResponse* response) override {
    const int64_t published = PublishedVersion(coordinator_.get());
    Mode mode;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back({*request, published, absl::Now()});
      mode = mode_;
    }
    if (mode == Mode::kFail) return grpc::Status(grpc::UNAVAILABLE, "disk on fire");
    if (mode == Mode::kHang) {
      while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      return grpc::Status(grpc::CANCELLED, "cancelled");
    }
    response->set_placement_version(request->placement_version());
    return grpc::Status::OK;
  }

 private:
  const std::unique_ptr<pb::Coordinator::Stub> coordinator_;
  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kOk;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

// A coordinator with `routers` fake routers and two fake expert nodes of 4 slots each (experts
// 0-3 on worker 0, 4-7 on worker 1), all registered; the nodes never heartbeat, so the
// coordinator's heartbeat timeout is long.
class BalancerTest : public testing::Test {
 protected:
  void Start(LoadBalancerOptions balancing, int routers = 2, bool dead_router = false) {
    CoordinatorMainOptions options;
    options.node.host = "127.0.0.1";
    options.shutdown_grace = absl::Milliseconds(200);
    options.coordinator.num_moe_layers = kLayers;
    options.coordinator.num_experts = kExperts;
    options.coordinator.expected_expert_nodes = 2;
    options.coordinator.heartbeat_interval = absl::Seconds(10);
    options.coordinator.heartbeat_timeout = absl::Seconds(60);
    options.coordinator.recovery_window = absl::ZeroDuration();
    options.coordinator.replica_slots_per_worker = replica_slots_;
    options.balancing = balancing;
    auto process = CoordinatorProcess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    process_ = *std::move(process);
    address_ = absl::StrCat("127.0.0.1:", process_->port());
    stub_ = CoordinatorStub(address_);
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(address_));
      ASSERT_NO_FATAL_FAILURE(Serve(workers_.back().get(), pb::ROLE_EXPERT, 4));
    }
    for (int i = 0; i < routers; ++i) {
      routers_.push_back(std::make_unique<FakeRouter>(address_));
      ASSERT_NO_FATAL_FAILURE(Serve(routers_.back().get(), pb::ROLE_ROUTER, 0));
      routers_.back()->Registered(last_node_, last_incarnation_);
    }
    // Port 1 refuses connections: a member the coordinator believes alive but cannot reach.
    if (dead_router) {
      ASSERT_NE(Register(pb::ROLE_ROUTER, "127.0.0.1:1", 0), 0u);
    }
    ASSERT_EQ(PublishedVersion(stub_.get()), 1);
  }

  void TearDown() override {
    if (process_ != nullptr) process_->Shutdown();
    for (auto& server : servers_) server->Shutdown(absl::ZeroDuration());
  }

  void Serve(grpc::Service* service, pb::Role role, int slots) {
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    auto server = GrpcServer::Start(options, {service});
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_NE(Register(role, absl::StrCat("127.0.0.1:", (*server)->port()), slots), 0u);
    servers_.push_back(*std::move(server));
  }

  uint32_t Register(pb::Role role, const std::string& address, int slots) {
    static uint64_t incarnation = 100;
    pb::RegisterRequest request;
    request.mutable_node()->set_role(role);
    request.mutable_node()->set_grpc_address(address);
    request.mutable_node()->set_expert_slots(slots);
    request.mutable_node()->set_incarnation(++incarnation);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::RegisterResponse response;
    const grpc::Status status = stub_->Register(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    last_node_ = response.node_id();
    last_incarnation_ = incarnation;
    return response.node_id();
  }

  absl::StatusOr<pb::LoadReport> Report(bool refresh) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::GetLoadReportRequest request;
    request.set_refresh(refresh);
    pb::LoadReport report;
    const grpc::Status status = stub_->GetLoadReport(&context, request, &report);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    return report;
  }

  absl::StatusOr<pb::RebalanceResponse> Rebalance(bool force) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    pb::RebalanceRequest request;
    request.set_force(force);
    pb::RebalanceResponse response;
    const grpc::Status status = stub_->Rebalance(&context, request, &response);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    return response;
  }

  ClusterPlacement Published() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::ClusterState state;
    EXPECT_TRUE(stub_->GetClusterState(&context, {}, &state).ok());
    return ClusterPlacementFromProto(state.placement()).value();
  }

  void Drain(uint32_t node) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::DrainRequest request;
    request.set_node_id(node);
    pb::DrainResponse response;
    const grpc::Status status = stub_->Drain(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  int replica_slots_ = 0;  // the coordinator's, for Start
  uint32_t last_node_ = 0;  // the last Register's
  uint64_t last_incarnation_ = 0;
  std::unique_ptr<CoordinatorProcess> process_;
  std::string address_;
  std::unique_ptr<pb::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::vector<std::unique_ptr<FakeRouter>> routers_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
};

LoadBalancerOptions TestBalancing() {
  LoadBalancerOptions options;
  options.gather_interval = absl::ZeroDuration();  // only when asked
  options.rpc_timeout = absl::Seconds(2);
  options.load_timeout = absl::Seconds(3);
  options.switch_timeout = absl::Seconds(3);
  options.retire_delay = absl::Milliseconds(50);
  options.spare_slots_per_worker = 1;
  return options;
}

// A window of expert loads without QB histograms: counts[layer] per expert.
pb::LoadStatsResponse LoadsWindow(const std::vector<std::vector<uint64_t>>& counts) {
  pb::LoadStatsResponse window;
  for (size_t l = 0; l < counts.size(); ++l) {
    pb::LayerLoadStats* layer = window.add_layers();
    layer->set_layer(static_cast<int>(l));
    layer->set_top_k(kTopK);
    layer->mutable_counts()->Add(counts[l].begin(), counts[l].end());
  }
  return window;
}

// A window with QB histograms of `tokens` tokens whose scores lean towards experts 0 and 1.
pb::LoadStatsResponse QbWindow(int64_t tokens, uint64_t seed, QbLayerStatistics* all) {
  const std::vector<float> bias = {0.01f, 0, -0.02f, 0, 0.03f, 0, 0, -0.01f};
  const std::vector<double> lean = {1.5, 1.0, 0, 0, 0, 0, 0, 0};
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> s(tokens * kExperts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < kExperts; ++j) {
      s[t * kExperts + j] = static_cast<float>(1.0 / (1.0 + std::exp(-(lean[j] + normal(rng)))));
    }
  }
  pb::LoadStatsResponse window;
  for (int l = 0; l < kLayers; ++l) {
    QbLayerStatistics qb = *QbLayerStatistics::Create(l, kTopK, bias, 100);
    qb.Record(s.data(), tokens);
    if (l == 0 && all != nullptr) {
      if (all->tokens() == 0) {
        *all = qb;
      } else {
        EXPECT_TRUE(all->Merge(qb).ok());
      }
    }
    pb::LayerLoadStats* out = window.add_layers();
    out->set_layer(l);
    out->set_top_k(kTopK);
    out->mutable_counts()->Add(qb.loads().begin(), qb.loads().end());
    out->mutable_bins()->Add(qb.data().counts.begin(), qb.data().counts.end());
    for (int b = 1; b <= qb.bins(); ++b) out->add_bin_edges(qb.range_lo() + b * qb.bin_width());
    out->mutable_bias()->Add(bias.begin(), bias.end());
  }
  return window;
}

double MaxVioOf(std::vector<double> load) {
  const double mean = (load[0] + load[1]) / 2;
  return (std::max(load[0], load[1]) - mean) / mean;
}

TEST_F(BalancerTest, GathersEveryAliveRouterWithResetAndMergesTheirWindows) {
  ASSERT_NO_FATAL_FAILURE(Start(TestBalancing(), /*routers=*/2, /*dead_router=*/true));
  QbLayerStatistics all =
      *QbLayerStatistics::Create(0, kTopK, std::vector<float>(kExperts, 0), 100);
  routers_[0]->SetWindow(QbWindow(300, 1, &all));
  routers_[1]->SetWindow(QbWindow(200, 2, &all));

  const absl::Time start = absl::Now();
  absl::StatusOr<pb::LoadReport> report = Report(/*refresh=*/true);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // the unreachable router did not hold it up
  EXPECT_EQ(report->routers(), 2);
  EXPECT_EQ(report->routers_failed(), 1);
  EXPECT_EQ(report->placement_version(), 1);
  for (const auto& router : routers_) EXPECT_EQ(router->resets(), std::vector<bool>{true});

  ASSERT_EQ(report->layers_size(), kLayers);
  const pb::LayerLoadReport& layer = report->layers(0);
  EXPECT_EQ(layer.tokens(), 500u);
  EXPECT_EQ(std::vector<uint64_t>(layer.expert_loads().begin(), layer.expert_loads().end()),
            all.loads());
  // Worker 0 holds experts 0-3, worker 1 experts 4-7.
  std::vector<double> workers(2, 0);
  for (int e = 0; e < kExperts; ++e) workers[e / 4] += static_cast<double>(all.loads()[e]);
  ASSERT_EQ(layer.worker_loads_size(), 2);
  EXPECT_DOUBLE_EQ(layer.worker_loads(0), workers[0]);
  EXPECT_NEAR(layer.worker_max_vio(), MaxVioOf(workers), 1e-12);
  const std::vector<float> expected = CenterBias(*all.EstimateBias());
  ASSERT_EQ(layer.qb_bias_size(), kExperts);
  for (int e = 0; e < kExperts; ++e) EXPECT_FLOAT_EQ(layer.qb_bias(e), expected[e]);

  // Without refresh: the same round again, no new calls. With one: the routers' windows are empty.
  absl::StatusOr<pb::LoadReport> again = Report(false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->layers(0).tokens(), 500u);
  EXPECT_EQ(routers_[0]->resets().size(), 1u);
  again = Report(true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->layers(0).tokens(), 500u);  // the window keeps adding up
  EXPECT_EQ(routers_[0]->resets().size(), 2u);

  const std::string metrics = DefaultMetrics().ExpositionText();
  EXPECT_NE(metrics.find(absl::StrCat("k3_coordinator_window_tokens ", 2 * 500)), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("k3_coordinator_worker_load_max_vio{layer=\"1\"}"), std::string::npos);
  EXPECT_NE(metrics.find("k3_coordinator_load_gathers_total{code=\"UNAVAILABLE\"}"),
            std::string::npos);
}

TEST_F(BalancerTest, LoadsTheNewExpertsBeforePublishingAndRetiresTheOldOnesAfterTheSwitch) {
  ASSERT_NO_FATAL_FAILURE(Start(TestBalancing()));
  // Layer 0: experts 0 and 1 (worker 0) are hot; layer 1: experts 6 and 7 (worker 1).
  const std::vector<std::vector<uint64_t>> counts = {{400, 300, 50, 50, 50, 50, 50, 50},
                                                     {50, 50, 50, 50, 50, 50, 300, 400}};
  routers_[0]->SetWindow(LoadsWindow(counts));
  routers_[1]->SetWindow(LoadsWindow(counts));

  const absl::Time start = absl::Now();
  absl::StatusOr<pb::RebalanceResponse> outcome = Rebalance(/*force=*/false);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  ASSERT_TRUE(outcome->rolled_out()) << outcome->reason();
  EXPECT_EQ(outcome->placement_version(), 2);
  EXPECT_EQ(outcome->window_tokens(), 2u * 2 * 500);
  // Before: 800 vs 200 tokens per worker in both layers.
  EXPECT_NEAR(outcome->worker_max_vio_before(), MaxVioOf({800, 200}), 1e-12);
  const ClusterPlacement placed = Published();
  ASSERT_EQ(placed.version(), 2);
  double after = 0;
  for (int l = 0; l < kLayers; ++l) {
    std::vector<double> loads(counts[l].begin(), counts[l].end());
    for (double& x : loads) x *= 2;  // two routers
    after += WorkerMaxVio(ExpectedWorkerLoad(placed.experts, l, loads)) / kLayers;
    for (int w = 0; w < 2; ++w) {
      EXPECT_LE(placed.experts.ExpertsOn(w, l).size(), 5u) << "4 slots plus 1 spare";
    }
  }
  EXPECT_NEAR(outcome->worker_max_vio_after(), after, 1e-12);
  EXPECT_LT(after, 0.5 * outcome->worker_max_vio_before());

  // Retirement follows after retire_delay.
  WaitFor([&] { return workers_[0]->calls().size() >= 2 && workers_[1]->calls().size() >= 2; });
  for (int w = 0; w < 2; ++w) {
    const std::vector<FakeWorker::Call> calls = workers_[w]->calls();
    ASSERT_EQ(calls.size(), 2u) << "worker " << w;
    // 1. Load version 2 while version 1 is still the published one.
    EXPECT_EQ(calls[0].request.placement_version(), 2);
    EXPECT_EQ(calls[0].request.worker(), w);
    EXPECT_EQ(calls[0].request.retire_below_version(), 0);
    EXPECT_EQ(calls[0].published, 1) << "worker " << w << " was asked to load after publishing";
    // The node keeps version 1 even if its cluster state has not named it yet.
    EXPECT_EQ(calls[0].request.committed_version(), 1);
    ASSERT_EQ(calls[0].request.experts_size(), kLayers);
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(calls[0].request.experts(l).layer(), l);
      EXPECT_EQ(std::vector<int>(calls[0].request.experts(l).expert_ids().begin(),
                                 calls[0].request.experts(l).expert_ids().end()),
                placed.experts.ExpertsOn(w, l));
    }
    // 2. Retire older versions only once every router switched to version 2.
    EXPECT_EQ(calls[1].request.placement_version(), 2);
    EXPECT_EQ(calls[1].request.retire_below_version(), 2);
    for (const auto& router : routers_) {
      const auto switched = router->switched();
      ASSERT_EQ(switched.count(2), 1u);
      EXPECT_LE(switched.at(2), calls[1].time);
    }
    EXPECT_GE(calls[1].time - start, absl::Milliseconds(50));
  }

  // The window restarted with the rollout; the report describes the new placement.
  absl::StatusOr<pb::LoadReport> report = Report(false);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->placement_version(), 2);
  EXPECT_EQ(report->rebalances(), 1);
  EXPECT_EQ(report->layers(0).tokens(), 0u);
}

TEST_F(BalancerTest, AWorkerThatCannotLoadAbandonsTheRollout) {
  ASSERT_NO_FATAL_FAILURE(Start(TestBalancing()));
  routers_[0]->SetWindow(
      LoadsWindow({{400, 300, 50, 50, 50, 50, 50, 50}, {400, 300, 50, 50, 50, 50, 50, 50}}));
  workers_[1]->set_mode(FakeWorker::Mode::kFail);
  absl::StatusOr<pb::RebalanceResponse> outcome = Rebalance(false);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable) << outcome.status();
  EXPECT_NE(outcome.status().message().find("disk on fire"), std::string::npos);
  EXPECT_EQ(Published().version(), 1);

  // The window was kept: the next attempt, with the worker back, rolls out version 3 (2 is burnt).
  workers_[1]->set_mode(FakeWorker::Mode::kOk);
  outcome = Rebalance(false);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->rolled_out());
  EXPECT_EQ(outcome->placement_version(), 3);
  EXPECT_EQ(Published().version(), 3);
  // Worker 0 saw: load 2 (abandoned), load 3, retire below 3. A retirement of the abandoned
  // rollout would have come between, since retire_delay is shorter than the second rollout.
  ASSERT_TRUE(WaitFor([&] { return workers_[0]->calls().size() >= 3; }));
  const std::vector<FakeWorker::Call> calls = workers_[0]->calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].request.placement_version(), 2);
  EXPECT_EQ(calls[0].request.retire_below_version(), 0);
  EXPECT_EQ(calls[1].request.placement_version(), 3);
  EXPECT_EQ(calls[1].request.retire_below_version(), 0);
  EXPECT_EQ(calls[1].request.committed_version(), 1);  // version 2 was given up
  EXPECT_EQ(calls[2].request.placement_version(), 3);
  EXPECT_EQ(calls[2].request.retire_below_version(), 3);
}

TEST_F(BalancerTest, EvenOrMissingLoadIsLeftAlone) {
  ASSERT_NO_FATAL_FAILURE(Start(TestBalancing()));
  absl::StatusOr<pb::RebalanceResponse> outcome = Rebalance(/*force=*/true);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->rolled_out());
  EXPECT_NE(outcome->reason().find("no tokens"), std::string::npos) << outcome->reason();

  routers_[0]->SetWindow(LoadsWindow(
      {{100, 100, 100, 100, 100, 100, 100, 100}, {100, 100, 100, 100, 100, 100, 100, 100}}));
  outcome = Rebalance(/*force=*/false);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->rolled_out());
  EXPECT_FALSE(outcome->reason().empty());
  EXPECT_DOUBLE_EQ(outcome->worker_max_vio_before(), 0);
  EXPECT_EQ(outcome->placement_version(), 1);
  EXPECT_EQ(Published().version(), 1);
  EXPECT_TRUE(workers_[0]->calls().empty());
}

TEST_F(BalancerTest, OnlineBiasPushesTheCentredQbEstimateToEveryRouter) {
  LoadBalancerOptions balancing = TestBalancing();
  balancing.online_bias_interval = absl::Milliseconds(100);
  // One router: its whole window arrives in one gathering round, whenever that is.
  ASSERT_NO_FATAL_FAILURE(Start(balancing, /*routers=*/1));
  QbLayerStatistics all =
      *QbLayerStatistics::Create(0, kTopK, std::vector<float>(kExperts, 0), 100);
  routers_[0]->SetWindow(QbWindow(400, 3, &all));
  ASSERT_TRUE(WaitFor([&] { return routers_[0]->biases().size() >= kLayers; }));
  // Later rounds gather an empty window and push nothing.
  const size_t gathered = routers_[0]->resets().size();
  ASSERT_TRUE(WaitFor([&] { return routers_[0]->resets().size() >= gathered + 2; }));
  const std::vector<float> expected = CenterBias(*all.EstimateBias());
  for (const auto& router : routers_) {
    const std::vector<pb::SetBiasRequest> biases = router->biases();
    ASSERT_EQ(biases.size(), static_cast<size_t>(kLayers));
    for (const pb::SetBiasRequest& bias : biases) {
      ASSERT_EQ(bias.values_size(), kExperts);
      if (bias.layer() != 0) continue;
      for (int e = 0; e < kExperts; ++e) EXPECT_FLOAT_EQ(bias.values(e), expected[e]);
    }
  }
  EXPECT_EQ(Published().version(), 1);  // the bias moves no experts
}

TEST_F(BalancerTest, ShutdownDoesNotWaitForARolloutStuckOnAWorker) {
  LoadBalancerOptions balancing = TestBalancing();
  balancing.load_timeout = absl::Seconds(60);
  ASSERT_NO_FATAL_FAILURE(Start(balancing));
  routers_[0]->SetWindow(
      LoadsWindow({{400, 300, 50, 50, 50, 50, 50, 50}, {400, 300, 50, 50, 50, 50, 50, 50}}));
  workers_[0]->set_mode(FakeWorker::Mode::kHang);
  absl::StatusOr<pb::RebalanceResponse> outcome;
  std::thread caller([&] { outcome = Rebalance(false); });
  WaitFor([&] { return !workers_[0]->calls().empty(); });
  ASSERT_EQ(workers_[0]->calls().size(), 1u);
  const absl::Time start = absl::Now();
  process_->Shutdown();
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(outcome.ok());
}

// A worker that hangs in LoadExperts holds up neither the balancer (its load report, a second
// Rebalance) nor the coordinator (the cluster state its heartbeats answer from): the rollout's
// calls end on gRPC's threads, not on an actor. Once the worker is gone from the cluster state
// the rollout gives up at once, long before its load timeout.
TEST_F(BalancerTest, AHungWorkerBlocksNeitherTheBalancerNorTheCoordinator) {
  LoadBalancerOptions balancing = TestBalancing();
  balancing.load_timeout = absl::Seconds(60);
  ASSERT_NO_FATAL_FAILURE(Start(balancing));
  routers_[0]->SetWindow(
      LoadsWindow({{400, 300, 50, 50, 50, 50, 50, 50}, {400, 300, 50, 50, 50, 50, 50, 50}}));
  workers_[0]->set_mode(FakeWorker::Mode::kHang);
  absl::StatusOr<pb::RebalanceResponse> outcome;
  absl::Time ended;
  std::thread caller([&] {
    outcome = Rebalance(false);
    ended = absl::Now();
  });
  ASSERT_TRUE(WaitFor([&] { return !workers_[0]->calls().empty(); }));
  absl::Duration slowest = absl::ZeroDuration();
  for (int i = 0; i < 5; ++i) {
    absl::Time start = absl::Now();
    const absl::StatusOr<pb::LoadReport> report = Report(/*refresh=*/false);
    EXPECT_TRUE(report.ok()) << report.status();
    slowest = std::max(slowest, absl::Now() - start);
    start = absl::Now();
    EXPECT_EQ(Published().version(), 1);
    slowest = std::max(slowest, absl::Now() - start);
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_LT(slowest, absl::Seconds(1)) << "the balancer or the coordinator waited for the worker";
  // One rollout at a time: a second Rebalance is told so at once.
  const absl::Time second = absl::Now();
  const absl::StatusOr<pb::RebalanceResponse> again = Rebalance(false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAborted) << again.status();
  EXPECT_LT(absl::Now() - second, absl::Seconds(1));

  // The hung worker leaves the cluster: the rollout gives up within its next look (200 ms).
  pb::ClusterState state;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    ASSERT_TRUE(stub_->GetClusterState(&context, {}, &state).ok());
  }
  const std::string hung = absl::StrCat("127.0.0.1:", servers_[0]->port());
  pb::LeaveRequest leave;
  for (const pb::Member& m : state.members()) {
    if (m.node().grpc_address() == hung) {
      leave.set_node_id(m.node().node_id());
      leave.set_incarnation(m.node().incarnation());
    }
  }
  ASSERT_NE(leave.node_id(), 0u);
  const absl::Time left = absl::Now();
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::LeaveResponse response;
    ASSERT_TRUE(stub_->Leave(&context, leave, &response).ok());
  }
  caller.join();
  EXPECT_LT(ended - left, absl::Seconds(2)) << "the rollout waited for its load timeout";
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted) << outcome.status();
  EXPECT_NE(outcome.status().message().find(absl::StrCat("expert node ", leave.node_id())),
            std::string::npos)
      << outcome.status();
  EXPECT_EQ(Published().version(), 1);
}

TEST(LoadBalancerOptionsTest, RejectsBadValues) {
  EXPECT_TRUE(LoadBalancerOptions().Validate().ok());
  LoadBalancerOptions o;
  o.spare_slots_per_worker = -1;
  EXPECT_FALSE(o.Validate().ok());
  o = LoadBalancerOptions();
  o.min_improvement = 1;
  EXPECT_FALSE(o.Validate().ok());
  o = LoadBalancerOptions();
  o.rebalance_interval = -absl::Seconds(1);
  EXPECT_FALSE(o.Validate().ok());
  o = LoadBalancerOptions();
  o.rpc_timeout = absl::ZeroDuration();
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace k3

namespace k3 {
namespace {

// A drained worker's experts move to the other worker before the placement drops it: the other
// loads them under the next version before that version is published; a failed load publishes
// nothing, and a later attempt succeeds.
// k3_coordinator_resizes_total{outcome="failed"} of the process's metrics (0 before the first).
double FailedResizes() {
  const std::string series = "k3_coordinator_resizes_total{outcome=\"failed\"} ";
  const std::string text = DefaultMetrics().ExpositionText();
  const size_t at = text.find(series);
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + series.size(), text.find('\n', at) - at - series.size()));
}

TEST_F(BalancerTest, ADrainedWorkersExpertsAreLoadedElsewhereBeforeThePlacementDropsIt) {
  replica_slots_ = 4;  // the survivor's 4 slots and 4 replica slots hold all 8 experts
  LoadBalancerOptions balancing = TestBalancing();
  balancing.resize_interval = absl::Milliseconds(20);
  balancing.resize_retry = absl::Milliseconds(300);
  ASSERT_NO_FATAL_FAILURE(Start(balancing));
  const ClusterPlacement before = Published();
  ASSERT_EQ(before.worker_nodes.size(), 2u);
  FakeWorker* survivor = workers_[1].get();  // registered second: worker 1
  survivor->set_mode(FakeWorker::Mode::kFail);
  const double failed_before = FailedResizes();
  ASSERT_NO_FATAL_FAILURE(Drain(before.worker_nodes[0]));
  // The rollout has given up once it counts as failed: by then it would have published.
  ASSERT_TRUE(WaitFor([&] { return FailedResizes() > failed_before; }));
  EXPECT_FALSE(survivor->calls().empty());
  EXPECT_EQ(Published().version(), 1) << "a placement was published although the load failed";

  survivor->set_mode(FakeWorker::Mode::kOk);
  ASSERT_TRUE(WaitFor([&] {
    return Published().worker_nodes == std::vector<uint32_t>{before.worker_nodes[1]};
  }));
  const ClusterPlacement after = Published();
  int loads = 0;
  for (const FakeWorker::Call& call : survivor->calls()) {
    if (call.request.placement_version() != after.version() ||
        call.request.retire_below_version() != 0) {
      continue;
    }
    ++loads;
    EXPECT_LT(call.published, after.version()) << "loaded after it was published";
    EXPECT_EQ(call.request.worker(), 0);
    ASSERT_EQ(call.request.experts_size(), kLayers);
    for (const pb::LayerExperts& layer : call.request.experts()) {
      EXPECT_EQ(layer.expert_ids_size(), kExperts);
    }
  }
  EXPECT_EQ(loads, 1);
  // The drained node is asked for nothing: its experts are no one's business any more.
  EXPECT_TRUE(workers_[0]->calls().empty());
}

}  // namespace
}  // namespace k3
