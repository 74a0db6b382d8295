// RouterCore with fake expert nodes (ExpertWorker on threads) over the in-process transport: the
// answers must equal LocalRoutedMoe's, and every failure must end the steps it touches with
// UNAVAILABLE naming the worker.
#include "router/router_core.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "moe/expert_placement.h"
#include "absl/strings/str_cat.h"
#include "cluster/actor.h"
#include "cluster/inproc_transport.h"
#include "cluster/span_log.h"
#include "base/trace_context.h"
#include "cluster/transport.h"
#include "cluster/test_wait.h"
#include "expert_nodes/expert_worker.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "engine/local_routed_moe.h"
#include "moe/moe_layer_map.h"
#include "nlohmann/json.hpp"
#include "router/gate.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr uint32_t kAttention = 1;
constexpr uint32_t kRouter = 2;
constexpr uint32_t kExpertA = 4;
constexpr uint32_t kExpertB = 9;
constexpr uint32_t kExpertC = 10;  // B's replacement
constexpr absl::Duration kWait = absl::Seconds(5);

// An expert node: an ExpertWorker answering on its own thread.
class FakeExpert {
 public:
  FakeExpert(InProcNetwork* network, uint32_t node, std::shared_ptr<const ModelWeights> weights,
             ExpertHosting hosting)
      : node_(node),
        transport_(network->CreateTransport()),
        worker_(std::move(weights), std::move(hosting), "expert node " + std::to_string(node)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeExpert() {
    stop_ = true;
    thread_.join();
  }

  uint32_t node() const { return node_; }
  std::string address() const { return transport_->LocalAddress(); }
  void ConnectRouter(const std::string& address) {
    ASSERT_TRUE(transport_->Connect(kRouter, address).ok());
  }
  // Stops or resumes serving; returns once the serving thread has seen it.
  void Pause(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
    mu_.Await(absl::Condition(
        +[](FakeExpert* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->seen_paused_ == e->paused_; },
        this));
  }
  void Kill() { transport_->Kill(); }
  // The next request it receives goes unanswered, as if lost on the way.
  void DropNextRequest() { drop_next_ = true; }

 private:
  void Loop() {
    while (!stop_) {
      {
        absl::MutexLock lock(&mu_);
        seen_paused_ = paused_;
        if (paused_) {
          mu_.AwaitWithTimeout(absl::Condition(
              +[](FakeExpert* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return !e->paused_; }, this),
              absl::Milliseconds(10));
          continue;
        }
      }
      absl::StatusOr<Received> received = transport_->Receive(absl::Now() + absl::Milliseconds(10));
      if (received.ok()) {
        if (received->kind == Received::Kind::kMessage && drop_next_.exchange(false)) continue;
        worker_.Handle(transport_.get(), *received, /*may_defer=*/false);
      } else if (received.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return;  // killed or closed
      }
    }
  }

  const uint32_t node_;
  std::unique_ptr<InProcTransport> transport_;
  ExpertWorker worker_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drop_next_{false};
  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool seen_paused_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The router's transport, whose Send to one chosen peer fails as to a peer whose death the router
// has not polled yet (the transport knows, the failure event is still queued).
class SendFailingTransport : public Transport {
 public:
  explicit SendFailingTransport(Transport* inner) : inner_(inner) {}
  void FailSendsTo(PeerId peer) { failing_ = peer; }

  std::string LocalAddress() const override { return inner_->LocalAddress(); }
  absl::Status Connect(PeerId peer, const std::string& address) override {
    return inner_->Connect(peer, address);
  }
  void Disconnect(PeerId peer) override { inner_->Disconnect(peer); }
  absl::Status Send(PeerId peer, std::string message) override {
    if (peer == failing_) return absl::UnavailableError(absl::StrCat("peer ", peer, " failed"));
    return inner_->Send(peer, std::move(message));
  }
  absl::StatusOr<Received> Receive(absl::Time deadline) override {
    return inner_->Receive(deadline);
  }
  void Close() override { inner_->Close(); }

 private:
  Transport* const inner_;
  std::atomic<PeerId> failing_{0};
};

class RouterCoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/router_core_ckpt";
    ASSERT_TRUE(WriteRandomModelFolder(*config, 11, dir).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = new std::shared_ptr<const Checkpoint>(*std::move(checkpoint));
    all_ = Load(WeightSelection::All()).release();
    router_only_ = Load(WeightSelection::RouterOnly()).release();
  }
  static void TearDownTestSuite() {
    delete all_;
    delete router_only_;
    delete checkpoint_;
  }
  static std::unique_ptr<ModelWeights> Load(const WeightSelection& selection) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(*checkpoint_, selection);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *std::move(weights) : nullptr;
  }
  static const ModelConfig& config() { return all_->config; }

  void TearDown() override {
    experts_.clear();
    StopRouter();
  }

  void StartRouter(absl::Duration step_timeout,
                   absl::Duration expert_retry_floor = absl::Milliseconds(300)) {
    router_transport_ = network_.CreateTransport();
    router_sends_ = std::make_unique<SendFailingTransport>(router_transport_.get());
    attention_ = network_.CreateTransport();
    links_ = std::make_unique<PeerLinks>(router_transport_.get(), absl::Milliseconds(20));
    RouterCoreOptions options;
    options.step_timeout = step_timeout;
    options.expert_retry_floor = expert_retry_floor;
    options.qb_bins = 20;
    options.per_expert_metrics = per_expert_metrics_;
    if (!spans_path_.empty()) {
      absl::StatusOr<std::unique_ptr<SpanLog>> spans = SpanLog::Open(spans_path_, "router");
      ASSERT_TRUE(spans.ok()) << spans.status();
      spans_ = *std::move(spans);
      options.spans = spans_.get();
    }
    absl::StatusOr<std::unique_ptr<RouterCore>> core =
        RouterCore::Create(router_only_, router_sends_.get(), links_.get(), options, &metrics_);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    ASSERT_TRUE(attention_->Connect(kRouter, router_transport_->LocalAddress()).ok());
    // As in RouterNode: the core lives on an actor whose turns poll the transport.
    router_actor_ = std::make_unique<Actor>("router");
    router_actor_->Post([this] { Pump(); });
  }

  void Pump() {
    if (!core_->Poll(absl::Now() + absl::Milliseconds(10)).ok()) return;
    router_actor_->Post([this] { Pump(); });
  }

  // Runs `fn` on the router's actor, the one thread that uses the core.
  template <typename F>
  auto OnRouter(F fn) {
    return router_actor_->Call(std::move(fn), absl::Now() + kWait);
  }

  void StopRouter() {
    if (router_actor_ != nullptr) router_actor_->Stop();
  }

  // An expert node hosting what `placement` gives `node`.
  FakeExpert* AddExpert(uint32_t node, const ClusterPlacement& placement) {
    ExpertHosting hosting = HostingFor(placement, node);
    auto weights = std::shared_ptr<const ModelWeights>(
        Load(WeightSelection::Experts(hosting.Union())).release());
    experts_[node] = std::make_unique<FakeExpert>(&network_, node, weights, hosting);
    experts_[node]->ConnectRouter(router_transport_->LocalAddress());
    return experts_[node].get();
  }

  // Two workers of 12 and 20 experts on nodes `a` and `b`.
  ClusterPlacement Placement(int64_t version, uint32_t a, uint32_t b) {
    absl::StatusOr<ExpertPlacement> experts =
        ContiguousPlacement(config().NumMoeLayers(), config().num_experts, {12, 20}, version);
    EXPECT_TRUE(experts.ok()) << experts.status();
    return ClusterPlacement{*experts, {a, b}};
  }

  // Experts of placement version 1 on workers A (12) and B (20), both alive, the router ready;
  // returns B. *placement, when given, receives the placement.
  FakeExpert* ServeTwoWorkers(ClusterPlacement* placement = nullptr) {
    const ClusterPlacement two = Placement(1, kExpertA, kExpertB);
    AddExpert(kExpertA, two);
    FakeExpert* b = AddExpert(kExpertB, two);
    Publish(two, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}});
    WaitReady();
    if (placement != nullptr) *placement = two;
    return b;
  }

  // Publishes a cluster state of the attention node, the router and `experts` (node -> state).
  // `lost_experts_reason`: the coordinator cannot move experts that lost every host.
  // `unrecoverable`: nodes whose death the coordinator could not repair, and why.
  void Publish(const ClusterPlacement& placement,
               const std::map<uint32_t, pb::MemberState>& experts,
               const std::string& lost_experts_reason = "",
               const std::map<uint32_t, std::string>& unrecoverable = {}) {
    pb::ClusterState state;
    state.set_lost_experts_reason(lost_experts_reason);
    state.mutable_unrecoverable_losses()->insert(unrecoverable.begin(), unrecoverable.end());
    auto add = [&](uint32_t id, pb::Role role, pb::MemberState member_state,
                   const std::string& address) {
      pb::Member* member = state.add_members();
      pb::NodeInfo* node = member->mutable_node();
      node->set_node_id(id);
      node->set_role(role);
      node->set_pid(1000 + id);
      node->set_host("testhost");
      node->set_incarnation(500 + id);
      node->set_transport_address(address);
      member->set_state(member_state);
    };
    add(kAttention, pb::ROLE_ATTENTION, pb::ALIVE, attention_->LocalAddress());
    add(kRouter, pb::ROLE_ROUTER, pb::ALIVE, router_transport_->LocalAddress());
    for (const auto& [id, member_state] : experts) {
      add(id, pb::ROLE_EXPERT, member_state, experts_.at(id)->address());
    }
    ClusterPlacementToProto(placement, state.mutable_placement());
    EXPECT_TRUE(OnRouter([&] { core_->UpdateClusterState(state); }).ok());
    links_->SetTargets(LinkTargets(state, {pb::ROLE_ATTENTION, pb::ROLE_EXPERT}, kRouter));
  }

  void WaitReady() {
    WaitFor([this] { return Readiness().ok(); }, kWait);
    ASSERT_TRUE(Readiness().ok()) << Readiness();
  }

  absl::Status Readiness() {
    return OnRouter([this] { return core_->Readiness(); });
  }

  // Waits until the router holds `steps` steps in flight (its pending-steps gauge, which the
  // poll thread sets after dispatching a request).
  void WaitPending(int steps) {
    const Gauge* pending =
        metrics_.AddGauge("k3_router_pending_steps", "MoE layer steps in flight").Get();
    ASSERT_TRUE(WaitFor([&] { return pending->Value() == steps; }, kWait))
        << pending->Value() << " steps pending, expected " << steps;
  }

  static std::vector<float> RandomRows(int64_t tokens, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> value(0.f, 1.f);
    std::vector<float> rows(tokens * config().hidden_size);
    for (float& v : rows) v = value(rng);
    return rows;
  }

  void Send(uint64_t step, int layer, const std::vector<float>& rows,
            std::vector<TraceContext> traces = {}) {
    MoeRequest request;
    request.traces = std::move(traces);
    request.step_id = step;
    request.layer = layer;
    request.width = config().hidden_size;
    request.tokens = static_cast<int64_t>(rows.size()) / request.width;
    request.rows = rows;
    ASSERT_TRUE(attention_->Send(kRouter, Encode(request)).ok());
  }

  // The answer to `step` (answers to other steps that come first are kept for later).
  MoeResponse Await(uint64_t step, absl::Duration wait = kWait) {
    const absl::Time deadline = absl::Now() + wait;
    while (answers_.count(step) == 0) {
      absl::StatusOr<Received> received = attention_->Receive(deadline);
      if (!received.ok()) {
        MoeResponse none;
        none.status = received.status();
        return none;
      }
      MoeResponse response;
      EXPECT_TRUE(Decode(received->bytes, &response).ok());
      answers_[response.step_id] = response;
    }
    MoeResponse response = answers_[step];
    answers_.erase(step);
    return response;
  }

  // Checks `response` against LocalRoutedMoe on the same rows.
  void ExpectMatchesLocal(const MoeResponse& response, int layer, const std::vector<float>& rows) {
    ASSERT_TRUE(response.status.ok()) << response.status;
    const int64_t tokens = static_cast<int64_t>(rows.size()) / config().hidden_size;
    LocalRoutedMoe local(all_);
    ASSERT_TRUE(local.Begin(layer, rows.data(), tokens).ok());
    std::vector<float> expected(tokens * config().ExpertWidth());
    ASSERT_TRUE(local.Wait(expected.data()).ok());
    ASSERT_EQ(response.tokens, tokens);
    ASSERT_EQ(response.width, config().ExpertWidth());
    ASSERT_EQ(response.rows.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(response.rows[i], expected[i], 1e-5 * (1 + std::abs(expected[i]))) << i;
    }
  }

  static std::shared_ptr<const Checkpoint>* checkpoint_;
  static ModelWeights* all_;
  static ModelWeights* router_only_;

  InProcNetwork network_;
  MetricsRegistry metrics_;
  std::unique_ptr<InProcTransport> router_transport_;
  std::unique_ptr<SendFailingTransport> router_sends_;
  std::unique_ptr<InProcTransport> attention_;
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<SpanLog> spans_;  // outlives core_
  std::unique_ptr<RouterCore> core_;
  std::map<uint32_t, std::unique_ptr<FakeExpert>> experts_;
  std::map<uint64_t, MoeResponse> answers_;
  std::unique_ptr<Actor> router_actor_;  // after core_: stops (in TearDown) before it goes
  bool per_expert_metrics_ = false;  // read by StartRouter
  std::string spans_path_;           // read by StartRouter: a trace file when not empty
};

std::shared_ptr<const Checkpoint>* RouterCoreTest::checkpoint_ = nullptr;
ModelWeights* RouterCoreTest::all_ = nullptr;
ModelWeights* RouterCoreTest::router_only_ = nullptr;

TEST_F(RouterCoreTest, ConcurrentStepsOfSeveralLayersMatchTheLocalEngine) {
  StartRouter(kWait);
  ServeTwoWorkers();

  // Three steps in flight at once, answered in whatever order the workers finish.
  const int layers[] = {1, 4, config().num_hidden_layers - 1};
  std::vector<std::vector<float>> rows;
  std::vector<uint64_t> counts(config().num_experts, 0);
  for (int i = 0; i < 3; ++i) {
    rows.push_back(RandomRows(5 + 7 * i, 100 + i));
    Send(10 + i, layers[i], rows[i]);
  }
  for (int i = 2; i >= 0; --i) {
    SCOPED_TRACE(layers[i]);
    ExpectMatchesLocal(Await(10 + i), layers[i], rows[i]);
  }

  // Load statistics count the same routing as the local engine.
  k3serve::cluster::v1::LoadStatsResponse stats =
      OnRouter([this] { return core_->LoadStats(/*reset=*/false); }).value();
  EXPECT_EQ(stats.placement_version(), 1);
  EXPECT_EQ(stats.window_steps(), 3u);
  EXPECT_EQ(stats.window_tokens(), 5u + 12u + 19u);
  ASSERT_EQ(stats.layers_size(), config().NumMoeLayers());
  for (int i = 0; i < 3; ++i) {
    LocalRoutedMoe local(all_);
    ASSERT_TRUE(local.Begin(layers[i], rows[i].data(), 5 + 7 * i).ok());
    std::vector<uint64_t> expected(config().num_experts, 0);
    for (int32_t e : local.last_routing().experts) ++expected[e];
    const int moe = *MoeLayerIndex(config(), layers[i]);
    const auto& counts_proto = stats.layers(moe).counts();
    EXPECT_EQ(std::vector<uint64_t>(counts_proto.begin(), counts_proto.end()), expected);
    EXPECT_EQ(stats.layers(moe).bins_size(), config().num_experts * 20);
  }
  EXPECT_NE(metrics_.ExpositionText().find("k3_router_steps_total{code=\"OK\"} 3"),
            std::string::npos)
      << metrics_.ExpositionText();
  // Where the steps' time went: one compute and one expert-wait observation per step.
  for (const char* sample : {"k3_router_step_compute_seconds_count 3",
                             "k3_router_step_expert_wait_seconds_count 3"}) {
    EXPECT_NE(metrics_.ExpositionText().find(sample), std::string::npos)
        << sample << "\n" << metrics_.ExpositionText();
  }
}

// Online bias: after SetBias the layer routes with the new bias, exactly as the single-process
// engine does with that bias in its weights; other layers keep the checkpoint's.
TEST_F(RouterCoreTest, ANewBiasChangesTheLayersRoutingFromTheNextStep) {
  StartRouter(kWait);
  ServeTwoWorkers();

  const int layer = 2;
  const int moe = *MoeLayerIndex(config(), layer);
  std::vector<float> bias(config().num_experts, 0.f);
  bias[5] = 10.f;  // expert 5 wins every token
  auto set_bias = [this](int moe_layer, std::vector<float> values) {
    return OnRouter([&] { return core_->SetBias(moe_layer, values); });
  };
  EXPECT_EQ(set_bias(moe, std::vector<float>(3, 0.f)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set_bias(config().NumMoeLayers(), bias).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(set_bias(moe, bias).ok());

  const std::vector<float> rows = RandomRows(9, 77);
  Send(1, layer, rows);
  const MoeResponse response = Await(1);
  ASSERT_TRUE(response.status.ok()) << response.status;
  ModelWeights biased = *all_;
  biased.layers[layer].moe.router.score_bias = bias;
  LocalRoutedMoe local(&biased);
  ASSERT_TRUE(local.Begin(layer, rows.data(), 9).ok());
  std::vector<float> expected(9 * config().ExpertWidth());
  ASSERT_TRUE(local.Wait(expected.data()).ok());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(response.rows[i], expected[i], 1e-5 * (1 + std::abs(expected[i]))) << i;
  }
  k3serve::cluster::v1::LoadStatsResponse stats =
      OnRouter([this] { return core_->LoadStats(false); }).value();
  EXPECT_EQ(stats.layers(moe).counts(5), 9u);
  EXPECT_EQ(stats.layers(moe).bias(5), 10.f);
  EXPECT_EQ(stats.layers(moe + 1).bias(5), all_->layers[layer + 1].moe.router.score_bias[5]);

  // The other layers still route with the checkpoint's bias.
  Send(2, layer + 1, rows);
  ExpectMatchesLocal(Await(2), layer + 1, rows);
}

// Steps whose rows need a dead worker's experts (no replicas) are held, not failed, while the
// coordinator repairs the placement; they resume under the new one.
TEST_F(RouterCoreTest, AKilledWorkersStepsAreHeldUntilItsSlotHasALiveNodeAgain) {
  StartRouter(kWait);
  FakeExpert* b = ServeTwoWorkers();
  const std::vector<float> rows = RandomRows(24, 7);  // 24 tokens x 4 experts: both workers
  Send(1, 2, rows);
  ExpectMatchesLocal(Await(1), 2, rows);

  // A step in flight when B dies, and one after: both wait.
  b->Pause(true);
  Send(2, 2, rows);
  WaitPending(1);
  b->Kill();
  Send(3, 2, rows);
  EXPECT_EQ(Await(2, absl::Milliseconds(500)).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(Readiness().ok());

  // The coordinator declares B dead and gives its slot to a new node: the held steps resume.
  const ClusterPlacement repaired = Placement(2, kExpertA, kExpertC);
  AddExpert(kExpertC, repaired);
  Publish(repaired, {{kExpertA, pb::ALIVE}, {kExpertB, pb::DEAD}, {kExpertC, pb::ALIVE}});
  ExpectMatchesLocal(Await(2), 2, rows);
  ExpectMatchesLocal(Await(3), 2, rows);
  WaitReady();
  Send(4, 2, rows);
  ExpectMatchesLocal(Await(4), 2, rows);
}

// A held step's wait counts against nobody: the worker it goes to under the repaired placement
// has the whole step timeout from then on to answer, even when the hold took most of one.
TEST_F(RouterCoreTest, AHeldStepGivesItsNewWorkerTheWholeStepTimeout) {
  constexpr absl::Duration kStepTimeout = absl::Seconds(2);
  StartRouter(kStepTimeout);
  FakeExpert* b = ServeTwoWorkers();
  const std::vector<float> rows = RandomRows(24, 14);
  b->Kill();
  const absl::Time start = absl::Now();
  Send(1, 2, rows);
  absl::SleepFor(absl::Milliseconds(1500));  // held for most of the step timeout

  const ClusterPlacement repaired = Placement(2, kExpertA, kExpertC);
  FakeExpert* c = AddExpert(kExpertC, repaired);
  c->Pause(true);  // the new worker answers a second after the step reaches it
  Publish(repaired, {{kExpertA, pb::ALIVE}, {kExpertB, pb::DEAD}, {kExpertC, pb::ALIVE}});
  absl::SleepFor(absl::Seconds(1));
  c->Pause(false);
  const MoeResponse answer = Await(1);
  EXPECT_GT(absl::Now() - start, kStepTimeout);
  ExpectMatchesLocal(answer, 2, rows);
}

// When the coordinator says the experts cannot move, held steps and new ones fail at once with
// UNAVAILABLE naming the worker and the cause.
TEST_F(RouterCoreTest, StepsFailNamingTheCauseWhenTheExpertsCannotMove) {
  StartRouter(kWait);
  ClusterPlacement placement;
  FakeExpert* b = ServeTwoWorkers(&placement);
  b->Pause(true);
  const std::vector<float> rows = RandomRows(24, 8);
  Send(1, 3, rows);
  WaitPending(1);
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::DEAD}});
  EXPECT_EQ(Await(1, absl::Milliseconds(300)).status.code(), absl::StatusCode::kDeadlineExceeded);
  const absl::Time told = absl::Now();
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::DEAD}},
          "the live expert nodes (8) offer 12 slots per MoE layer for 32 experts");
  MoeResponse lost = Await(1, absl::Seconds(2));
  EXPECT_LT(absl::Now() - told, absl::Milliseconds(500));
  EXPECT_EQ(lost.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lost.status.message().find("expert worker node 9 (pid 1009 on testhost) lost: the "
                                       "coordinator marked it DEAD"),
            absl::string_view::npos)
      << lost.status;
  EXPECT_NE(lost.status.message().find("the coordinator cannot move its experts: the live "
                                       "expert nodes (8) offer 12 slots"),
            absl::string_view::npos)
      << lost.status;
  Send(2, 3, rows);
  MoeResponse fast = Await(2, absl::Milliseconds(500));
  EXPECT_EQ(fast.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fast.status.message().find("offer 12 slots"), absl::string_view::npos)
      << fast.status;
}

// A worker whose death the coordinator has said it could not repair fails its steps at once,
// before the coordinator even notices it died.
TEST_F(RouterCoreTest, AKilledWorkerWhoseLossCannotBeRepairedFailsItsStepsFast) {
  StartRouter(kWait);
  const ClusterPlacement placement = Placement(1, kExpertA, kExpertB);
  AddExpert(kExpertA, placement);
  FakeExpert* b = AddExpert(kExpertB, placement);
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}}, "",
          {{kExpertB, "the other live expert nodes offer 12 slots per MoE layer for 32 experts"}});
  WaitReady();
  const std::vector<float> rows = RandomRows(24, 12);
  b->Pause(true);
  Send(1, 2, rows);
  WaitPending(1);
  const absl::Time killed = absl::Now();
  b->Kill();
  MoeResponse lost = Await(1, absl::Seconds(2));
  EXPECT_LT(absl::Now() - killed, absl::Milliseconds(500));
  EXPECT_EQ(lost.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lost.status.message().find("expert worker node 9 (pid 1009 on testhost) lost"),
            absl::string_view::npos)
      << lost.status;
  EXPECT_NE(lost.status.message().find("the coordinator cannot move its experts: the other live "
                                       "expert nodes offer 12 slots"),
            absl::string_view::npos)
      << lost.status;
  Send(2, 2, rows);
  EXPECT_EQ(Await(2, absl::Milliseconds(500)).status.code(), absl::StatusCode::kUnavailable);
}

TEST_F(RouterCoreTest, SilentWorkerTimesOutAndCountsAsLostUntilItAnswers) {
  StartRouter(absl::Milliseconds(300));
  FakeExpert* b = ServeTwoWorkers();
  const std::vector<float> rows = RandomRows(24, 9);
  b->Pause(true);
  const absl::Time sent = absl::Now();
  Send(1, 5, rows);
  MoeResponse late = Await(1, absl::Seconds(3));
  EXPECT_GE(absl::Now() - sent, absl::Milliseconds(300));
  EXPECT_EQ(late.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(late.status.message().find("expert worker node 9 (pid 1009 on testhost) lost: no "
                                       "answer"),
            absl::string_view::npos)
      << late.status;
  EXPECT_FALSE(Readiness().ok());
  // Without replicas the next step still goes to B (nobody else has its experts): it times out
  // too, naming the missed answer, not waiting for a placement that will not come.
  Send(2, 5, rows);
  MoeResponse again = Await(2, absl::Seconds(3));
  EXPECT_EQ(again.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(again.status.message().find("lost: no answer"), absl::string_view::npos)
      << again.status;
  EXPECT_EQ(again.status.message().find("no live node took its experts"), absl::string_view::npos)
      << again.status;

  b->Pause(false);  // it answers steps 1 and 2 late: alive after all
  WaitReady();
  Send(3, 5, rows);
  ExpectMatchesLocal(Await(3), 5, rows);
}

// A worker whose answer to one step was lost (it never knew of the step) serves the next one: the
// suspicion the lost answer raised cannot stop the steps that need it for good.
TEST_F(RouterCoreTest, AWorkerThatMissedOneStepServesTheNext) {
  StartRouter(absl::Milliseconds(300));
  FakeExpert* b = ServeTwoWorkers();
  const std::vector<float> rows = RandomRows(24, 13);  // 24 tokens x 4 experts: both workers
  b->DropNextRequest();
  Send(1, 4, rows);
  EXPECT_EQ(Await(1, absl::Seconds(3)).status.code(), absl::StatusCode::kUnavailable);
  Send(2, 4, rows);
  ExpectMatchesLocal(Await(2), 4, rows);
  WaitReady();
}

// A traced layer step leaves one router span under the attention step's span, whether it is
// answered, fails (a silent worker, then the step timeout), or is held for a live host of its
// experts and fails without ever going out.
TEST_F(RouterCoreTest, TracedStepsLeaveASpanWhetherAnsweredOrFailed) {
  spans_path_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/router-spans.jsonl");
  StartRouter(absl::Milliseconds(300));
  FakeExpert* b = ServeTwoWorkers();
  const TraceContext trace =
      ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").value();
  const std::vector<float> rows = RandomRows(24, 9);
  Send(1, 5, rows, {trace});
  ExpectMatchesLocal(Await(1), 5, rows);
  b->Pause(true);
  Send(2, 5, rows, {trace});
  EXPECT_EQ(Await(2, absl::Seconds(3)).status.code(), absl::StatusCode::kUnavailable);
  // B dies: the next step is held for a new host of its experts, then fails after the step
  // timeout.
  b->Kill();
  Send(3, 5, rows, {trace});
  MoeResponse held = Await(3, absl::Seconds(3));
  EXPECT_EQ(held.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(held.status.message().find("no live node took its experts within"),
            absl::string_view::npos)
      << held.status;
  b->Pause(false);
  StopRouter();

  std::ifstream file(spans_path_);
  std::vector<nlohmann::json> spans;
  for (std::string line; std::getline(file, line);) spans.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(spans.size(), 3u);
  for (const nlohmann::json& span : spans) {
    EXPECT_EQ(span["name"], "k3.router.layer");
    EXPECT_EQ(span["trace_id"], HexId(trace.trace_id));
    EXPECT_EQ(span["parent_span_id"], HexId(trace.span_id));
    EXPECT_EQ(span["attributes"]["k3.layer"], 5);
    EXPECT_EQ(span["attributes"]["k3.tokens"], 24);
  }
  EXPECT_EQ(spans[0]["attributes"]["k3.ok"], 1);
  EXPECT_EQ(spans[1]["attributes"]["k3.ok"], 0);
  // The step timeout counts from the request's arrival, where the span starts.
  EXPECT_GE(spans[1]["end_time_unix_nano"].get<int64_t>() -
                spans[1]["start_time_unix_nano"].get<int64_t>(),
            300'000'000);
  // The held step: its whole time was spent waiting for experts.
  EXPECT_EQ(spans[2]["attributes"]["k3.ok"], 0);
  EXPECT_EQ(spans[2]["attributes"]["k3.compute_ms"], 0);
  EXPECT_GE(spans[2]["attributes"]["k3.expert_wait_ms"].get<double>(), 300);
  EXPECT_NE(spans[2]["span_id"], spans[1]["span_id"]);
}

// With replicas, a hung worker's rows go to the replica after the expert deadline (here its
// 100 ms floor), far below the step timeout, and new steps avoid it until it answers again.
TEST_F(RouterCoreTest, HungWorkerWithReplicasIsRoutedAroundAfterTheExpertDeadline) {
  StartRouter(absl::Seconds(20), absl::Milliseconds(100));
  ClusterPlacement placement = Placement(1, kExpertA, kExpertB);
  AddRingReplicas(&placement.experts, 20);
  AddExpert(kExpertA, placement);
  FakeExpert* b = AddExpert(kExpertB, placement);
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}});
  WaitReady();
  const std::vector<float> rows = RandomRows(24, 9);
  Send(1, 5, rows);
  ExpectMatchesLocal(Await(1), 5, rows);

  b->Pause(true);
  Send(2, 5, rows);
  ExpectMatchesLocal(Await(2, absl::Seconds(10)), 5, rows);
  // Step 2 waited for the deadline; step 3 goes to the live replica at once. Neither waits for
  // the 20 s step timeout.
  Send(3, 5, rows);
  ExpectMatchesLocal(Await(3, absl::Seconds(10)), 5, rows);
  EXPECT_TRUE(Readiness().ok()) << Readiness();

  b->Pause(false);  // it answers step 2 late and takes rows again
  Send(4, 5, rows);
  ExpectMatchesLocal(Await(4), 5, rows);
}

// Three workers with ring replicas: worker 0's rows name experts whose other hosts are worker 1
// (worker 1's share) and worker 2 (worker 0's own share), so no one worker can take them all. A
// hung worker 0's rows are split over the two; the answer still equals the local engine's.
TEST_F(RouterCoreTest, AHungWorkersRowsAreSplitOverTheLiveHostsOfEachExpert) {
  StartRouter(absl::Seconds(20), absl::Milliseconds(100));
  absl::StatusOr<ExpertPlacement> experts =
      ContiguousPlacement(config().NumMoeLayers(), config().num_experts, {11, 11, 10}, 1);
  ASSERT_TRUE(experts.ok()) << experts.status();
  AddRingReplicas(&*experts, 11);
  const ClusterPlacement placement{*experts, {kExpertA, kExpertB, kExpertC}};
  FakeExpert* a = AddExpert(kExpertA, placement);
  AddExpert(kExpertB, placement);
  AddExpert(kExpertC, placement);
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}, {kExpertC, pb::ALIVE}});
  WaitReady();
  const std::vector<float> rows = RandomRows(48, 13);
  a->Pause(true);
  Send(1, 5, rows);
  ExpectMatchesLocal(Await(1, absl::Seconds(10)), 5, rows);
  Send(2, 5, rows);
  ExpectMatchesLocal(Await(2, absl::Seconds(10)), 5, rows);
  a->Pause(false);
}

// A worker that dies between the router's liveness check and its Send: with replicas its rows
// go to them at once and the step still equals the local engine's; without, the step fails
// naming the worker.
TEST_F(RouterCoreTest, RowsThatCannotBeSentGoToReplicas) {
  StartRouter(absl::Seconds(20), absl::Seconds(10));
  ClusterPlacement placement = Placement(1, kExpertA, kExpertB);
  AddRingReplicas(&placement.experts, 20);
  AddExpert(kExpertA, placement);
  AddExpert(kExpertB, placement);
  Publish(placement, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}});
  WaitReady();
  const std::vector<float> rows = RandomRows(24, 9);
  router_sends_->FailSendsTo(kExpertB);
  Send(1, 5, rows);
  // Well within the 10 s expert deadline: nothing waited for B.
  ExpectMatchesLocal(Await(1, absl::Seconds(3)), 5, rows);
}

TEST_F(RouterCoreTest, RowsThatCannotBeSentWithoutReplicasWaitForANewPlacement) {
  StartRouter(absl::Seconds(20));
  ServeTwoWorkers();
  const std::vector<float> rows = RandomRows(24, 9);
  router_sends_->FailSendsTo(kExpertB);
  Send(1, 5, rows);
  EXPECT_EQ(Await(1, absl::Milliseconds(500)).status.code(), absl::StatusCode::kDeadlineExceeded);
  const ClusterPlacement moved = Placement(2, kExpertA, kExpertC);
  AddExpert(kExpertC, moved);
  Publish(moved, {{kExpertA, pb::ALIVE}, {kExpertB, pb::ALIVE}, {kExpertC, pb::ALIVE}});
  ExpectMatchesLocal(Await(1, absl::Seconds(3)), 5, rows);
}

// The opt-in per-expert counters equal the gate's own choice on the same rows, summed over the
// layers the steps went to.
TEST_F(RouterCoreTest, PerExpertCountersCountTheGatesChoices) {
  per_expert_metrics_ = true;
  StartRouter(kWait);
  ServeTwoWorkers();
  std::vector<double> expected(config().num_experts, 0);
  const int layers[] = {1, 5};
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> rows = RandomRows(9 + i, 30 + i);
    Send(i + 1, layers[i], rows);
    ASSERT_TRUE(Await(i + 1).status.ok());
    Routing routing;
    RouteTokens(router_only_->layers[layers[i]].moe.router, config(), rows.data(),
                static_cast<int64_t>(rows.size()) / config().hidden_size, &routing);
    for (int32_t e : routing.experts) ++expected[e];
  }
  MetricFamily<Counter>& family = metrics_.AddCounter("k3_router_expert_routed_tokens_total", "",
                                                      {"expert"});
  double total = 0;
  for (int e = 0; e < config().num_experts; ++e) {
    EXPECT_EQ(family.WithLabels({absl::StrCat(e)})->Value(), expected[e]) << "expert " << e;
    total += expected[e];
  }
  EXPECT_EQ(total, (9 + 10) * config().num_experts_per_token);
}

TEST_F(RouterCoreTest, BadRequestsAreAnsweredWithTheirReason) {
  StartRouter(kWait);
  EXPECT_EQ(Readiness().code(), absl::StatusCode::kUnavailable);
  // Members known, no placement yet.
  Publish(ClusterPlacement(), {});
  const std::vector<float> rows = RandomRows(3, 10);
  Send(1, 2, rows);
  MoeResponse early = Await(1);
  EXPECT_EQ(early.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(early.status.message().find("no expert placement yet"), absl::string_view::npos)
      << early.status;

  ServeTwoWorkers();

  Send(2, 0, rows);  // the dense layer
  MoeResponse dense = Await(2);
  EXPECT_EQ(dense.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dense.status.message().find("not a MoE layer"), absl::string_view::npos) << dense.status;

  MoeRequest narrow;
  narrow.step_id = 3;
  narrow.layer = 2;
  narrow.tokens = 1;
  narrow.width = 8;
  narrow.rows.assign(8, 1.f);
  ASSERT_TRUE(attention_->Send(kRouter, Encode(narrow)).ok());
  EXPECT_EQ(Await(3).status.code(), absl::StatusCode::kInvalidArgument);

  MoeRequest truncated;
  truncated.step_id = 4;
  truncated.layer = 2;
  truncated.tokens = 3;
  truncated.width = config().hidden_size;
  truncated.rows = rows;
  std::string bytes = Encode(truncated);
  bytes.resize(bytes.size() - 4);
  ASSERT_TRUE(attention_->Send(kRouter, bytes).ok());
  EXPECT_EQ(Await(4).status.code(), absl::StatusCode::kInvalidArgument);

  // Nothing to route: an empty answer.
  MoeRequest empty = truncated;
  empty.step_id = 5;
  empty.tokens = 0;
  empty.rows.clear();
  ASSERT_TRUE(attention_->Send(kRouter, Encode(empty)).ok());
  MoeResponse none = Await(5);
  EXPECT_TRUE(none.status.ok()) << none.status;
  EXPECT_EQ(none.tokens, 0);

  // Still serving.
  Send(6, 2, rows);
  ExpectMatchesLocal(Await(6), 2, rows);
}

}  // namespace
}  // namespace k3
