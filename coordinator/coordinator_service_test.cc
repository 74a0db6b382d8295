// The coordinator over real gRPC on localhost: CoordinatorProcess (service, health, metrics),
// CoordinatorClient (the nodes' side) and the argument parser.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/coordinator_client.h"
#include "coordinator/coordinator_main.h"
#include "cluster/grpc_server.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr absl::Duration kRpcTimeout = absl::Seconds(2);

CoordinatorMainOptions TestOptions() {
  CoordinatorMainOptions options;
  options.node.host = "127.0.0.1";
  options.node.metrics_port = 0;
  options.shutdown_grace = absl::Milliseconds(200);
  CoordinatorOptions& c = options.coordinator;
  c.num_moe_layers = 2;
  c.num_experts = 8;
  c.expected_expert_nodes = 2;
  c.heartbeat_interval = absl::Milliseconds(100);
  c.heartbeat_timeout = absl::Milliseconds(500);
  c.recovery_window = absl::ZeroDuration();
  return options;
}

std::string Address(int port) { return absl::StrCat("127.0.0.1:", port); }

std::unique_ptr<pb::Coordinator::Stub> Stub(int port) {
  return pb::Coordinator::NewStub(
      grpc::CreateChannel(Address(port), grpc::InsecureChannelCredentials()));
}

pb::ClusterState GetState(pb::Coordinator::Stub* stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  pb::ClusterState state;
  const grpc::Status status = stub->GetClusterState(&context, {}, &state);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return state;
}

// Polls GetClusterState until `done` holds or `timeout` passes; returns the last state.
pb::ClusterState WaitForState(pb::Coordinator::Stub* stub,
                              const std::function<bool(const pb::ClusterState&)>& done,
                              absl::Duration timeout = absl::Seconds(5)) {
  pb::ClusterState state;
  WaitFor(
      [&] {
        state = GetState(stub);
        return done(state);
      },
      timeout);
  return state;
}

const pb::Member* FindMember(const pb::ClusterState& state, uint32_t id) {
  for (const pb::Member& m : state.members()) {
    if (m.node().node_id() == id) return &m;
  }
  return nullptr;
}

pb::NodeInfo NodeOf(pb::Role role, int slots = 0) {
  static int next_port = 20000;
  pb::NodeInfo info;
  info.set_role(role);
  info.set_grpc_address(absl::StrCat("127.0.0.1:", next_port++));
  info.set_transport_address("ucx-address-bytes");
  info.set_expert_slots(slots);
  return info;
}

std::unique_ptr<CoordinatorClient> StartClient(int port, pb::Role role, int slots = 0,
                                               CoordinatorCallbacks callbacks = {}) {
  CoordinatorClientOptions options;
  options.coordinator_address = Address(port);
  options.node = NodeOf(role, slots);
  options.max_backoff = absl::Milliseconds(200);
  auto client = std::make_unique<CoordinatorClient>(options, std::move(callbacks));
  client->Start();
  return client;
}

// GET `path` from 127.0.0.1:port; the body of a 200 answer, else "".
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string raw;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\n\r\n");
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, n);
  }
  close(fd);
  if (raw.rfind("HTTP/1.1 200", 0) != 0) return "";
  return raw.substr(raw.find("\r\n\r\n") + 4);
}

bool HasLine(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(CoordinatorArgsTest, ParsesFlagsInBothSpellings) {
  absl::StatusOr<CoordinatorMainOptions> o = ParseCoordinatorArgs(
      {"--port", "7000", "--num-experts=8", "--num-moe-layers", "3", "--expected-experts", "2",
       "--metrics-port=9100", "--heartbeat-timeout-ms", "900", "--required-roles=router,expert"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->node.port, 7000);
  EXPECT_EQ(o->node.metrics_port, 9100);
  EXPECT_EQ(o->coordinator.num_experts, 8);
  EXPECT_EQ(o->coordinator.num_moe_layers, 3);
  EXPECT_EQ(o->coordinator.expected_expert_nodes, 2);
  EXPECT_EQ(o->coordinator.heartbeat_timeout, absl::Milliseconds(900));
  EXPECT_EQ(o->coordinator.required_roles,
            (std::vector<pb::Role>{pb::ROLE_ROUTER, pb::ROLE_EXPERT}));
}

TEST(CoordinatorArgsTest, ParsesTheLoadBalancingFlags) {
  absl::StatusOr<CoordinatorMainOptions> o = ParseCoordinatorArgs(
      {"--num-experts=8", "--num-moe-layers=2", "--load-stats-interval-ms", "250",
       "--rebalance-interval-ms=30000", "--spare-slots-per-worker", "2",
       "--rebalance-min-improvement=0.25", "--retire-delay-ms", "100",
       "--online-bias-interval-ms", "60000"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->balancing.gather_interval, absl::Milliseconds(250));
  EXPECT_EQ(o->balancing.rebalance_interval, absl::Seconds(30));
  EXPECT_EQ(o->balancing.spare_slots_per_worker, 2);
  EXPECT_DOUBLE_EQ(o->balancing.min_improvement, 0.25);
  EXPECT_EQ(o->balancing.retire_delay, absl::Milliseconds(100));
  EXPECT_EQ(o->balancing.online_bias_interval, absl::Minutes(1));
  // Off by default.
  o = ParseCoordinatorArgs({"--num-experts=8", "--num-moe-layers=2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->balancing.rebalance_interval, absl::ZeroDuration());
  EXPECT_EQ(o->balancing.online_bias_interval, absl::ZeroDuration());
}

TEST(CoordinatorArgsTest, TakesTheExpertShapeFromAModelConfig) {
  absl::StatusOr<ModelConfig> tiny = NamedConfig("k3-tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  absl::StatusOr<CoordinatorMainOptions> o = ParseCoordinatorArgs({"--model", "k3-tiny"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.num_experts, tiny->num_experts);
  int moe_layers = 0;
  for (int layer = 0; layer < tiny->num_hidden_layers; ++layer) moe_layers += tiny->IsMoe(layer);
  EXPECT_EQ(o->coordinator.num_moe_layers, moe_layers);
  EXPECT_EQ(o->coordinator.required_roles.size(), 3u);
}

TEST(CoordinatorArgsTest, RejectsBadArguments) {
  const std::vector<std::vector<std::string>> bad = {
      {"--num-experts", "8", "--num-moe-layers", "2", "--bogus", "1"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--port", "abc"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--port", "70000"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--port"},
      {"--num-experts", "8", "--num-moe-layers", "2", "stray"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--required-roles", "attention,boss"},
      {"--num-experts", "8"},                       // no layers
      {"--port", "1"},                               // no model shape at all
      {"--model", "/no/such/model/dir"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--heartbeat-interval-ms", "2000"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--spare-slots-per-worker", "-1"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--rebalance-min-improvement", "1.5"},
      {"--num-experts", "8", "--num-moe-layers", "2", "--rebalance-min-improvement", "x"},
      {"--num-experts", "0", "--num-moe-layers", "0", "--rebalance-interval-ms", "100"},
  };
  for (const auto& args : bad) {
    absl::StatusOr<CoordinatorMainOptions> o = ParseCoordinatorArgs(args);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << args.back();
    EXPECT_FALSE(o.status().message().empty());
  }
  absl::StatusOr<CoordinatorMainOptions> dense =
      ParseCoordinatorArgs({"--num-experts", "0", "--num-moe-layers", "0"});
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->coordinator.required_roles,
            (std::vector<pb::Role>{pb::ROLE_ATTENTION, pb::ROLE_ROUTER}));
}

TEST(CoordinatorProcessTest, ServesHealthAndRejectsBadRegistrationsOverTheWire) {
  auto process = CoordinatorProcess::Start(TestOptions());
  ASSERT_TRUE(process.ok()) << process.status();
  const int port = (*process)->port();
  auto channel = grpc::CreateChannel(Address(port), grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckServing(channel, "", kRpcTimeout).value(), true);
  EXPECT_EQ(CheckServing(channel, "k3serve.cluster.v1.Coordinator", kRpcTimeout).value(), true);
  EXPECT_EQ(HttpGet((*process)->metrics_port(), "/healthz"), "ok\n");

  auto stub = pb::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  pb::RegisterRequest request;
  *request.mutable_node() = NodeOf(pb::ROLE_EXPERT, /*slots=*/0);
  request.mutable_node()->set_incarnation(5);
  pb::RegisterResponse response;
  const grpc::Status status = stub->Register(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("expert_slots"), std::string::npos);

  (*process)->Shutdown();
  EXPECT_FALSE(CheckServing(channel, "", absl::Milliseconds(300)).ok());
}

TEST(CoordinatorProcessTest, PlacesExpertsDetectsAKilledNodeAndHandsItsShareToASpare) {
  auto process = CoordinatorProcess::Start(TestOptions());
  ASSERT_TRUE(process.ok()) << process.status();
  const int port = (*process)->port();
  auto stub = Stub(port);

  auto attention = StartClient(port, pb::ROLE_ATTENTION);
  auto router = StartClient(port, pb::ROLE_ROUTER);
  auto expert = StartClient(port, pb::ROLE_EXPERT, 4);
  const uint32_t expert_id = expert->WaitRegistered(absl::Now() + absl::Seconds(5)).value();

  // The victim is an expert node driven by hand, so it can die without saying Leave.
  pb::RegisterRequest request;
  *request.mutable_node() = NodeOf(pb::ROLE_EXPERT, 4);
  request.mutable_node()->set_incarnation(77);
  pb::RegisterResponse registered;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    ASSERT_TRUE(stub->Register(&context, request, &registered).ok());
  }
  const uint32_t victim = registered.node_id();
  EXPECT_EQ(registered.heartbeat_interval_ms(), 100);
  std::atomic<bool> beating{true};
  std::atomic<int> beats{0};
  absl::Time last_beat;  // written by the heart, read after it is joined
  std::thread heart([&] {
    while (beating) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
      pb::HeartbeatRequest hb;
      hb.set_node_id(victim);
      hb.set_incarnation(77);
      pb::HeartbeatResponse reply;
      EXPECT_TRUE(stub->Heartbeat(&context, hb, &reply).ok());
      EXPECT_FALSE(reply.unknown_node());
      last_beat = absl::Now();
      ++beats;
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  // The death is timed from the last beat, so there must be one: on a loaded machine the heart's
  // thread may not run at all before the victim is stopped a few milliseconds later.
  if (!WaitFor([&] { return beats > 0; })) {
    beating = false;
    heart.join();
    FAIL() << "the victim never sent a heartbeat";
  }

  pb::ClusterState state = WaitForState(stub.get(), [](const auto& s) { return s.ready(); });
  ASSERT_TRUE(state.ready()) << state.not_ready_reason();
  EXPECT_EQ(state.placement().version(), 1);
  const std::set<uint32_t> placed(state.placement().worker_node_ids().begin(),
                                  state.placement().worker_node_ids().end());
  EXPECT_EQ(placed, (std::set<uint32_t>{expert_id, victim}));
  EXPECT_EQ(FindMember(state, victim)->node().transport_address(), "ucx-address-bytes");
  // The clients come to hold the same placement.
  EXPECT_TRUE(WaitFor([&] {
    return router->cluster_state().placement().SerializeAsString() ==
           state.placement().SerializeAsString();
  })) << router->cluster_state().placement().DebugString();

  // A spare joins, then the victim dies.
  auto spare = StartClient(port, pb::ROLE_EXPERT, 4);
  const uint32_t spare_id = spare->WaitRegistered(absl::Now() + absl::Seconds(5)).value();
  beating = false;
  heart.join();
  state = WaitForState(stub.get(), [&](const auto& s) {
    return FindMember(s, victim)->state() == pb::DEAD;
  });
  const absl::Duration to_dead = absl::Now() - last_beat;
  ASSERT_EQ(FindMember(state, victim)->state(), pb::DEAD);
  EXPECT_GE(to_dead, absl::Milliseconds(500));   // the timeout
  EXPECT_LE(to_dead, absl::Milliseconds(1500));  // timeout + tick + polling, with slack

  state = WaitForState(stub.get(), [](const auto& s) { return s.placement().version() == 2; });
  const std::set<uint32_t> replaced(state.placement().worker_node_ids().begin(),
                                    state.placement().worker_node_ids().end());
  EXPECT_EQ(replaced, (std::set<uint32_t>{expert_id, spare_id}));
  EXPECT_TRUE(state.ready()) << state.not_ready_reason();

  // Metrics agree with the state.
  const std::string metrics = HttpGet((*process)->metrics_port(), "/metrics");
  EXPECT_TRUE(HasLine(metrics, "k3_coordinator_members{role=\"expert\",state=\"dead\"} 1"))
      << metrics;
  EXPECT_TRUE(HasLine(metrics, "k3_coordinator_members{role=\"expert\",state=\"alive\"} 2"));
  EXPECT_TRUE(HasLine(metrics, "k3_coordinator_placement_version 2"));
  EXPECT_TRUE(HasLine(metrics, "k3_coordinator_ready 1"));
  EXPECT_NE(metrics.find("k3_coordinator_rpcs_total{method=\"Heartbeat\",code=\"OK\"}"),
            std::string::npos);

  // A client that stops says goodbye.
  const uint32_t attention_id = attention->WaitRegistered(absl::Now()).value();
  attention->Stop();
  state = GetState(stub.get());
  EXPECT_EQ(FindMember(state, attention_id)->state(), pb::LEFT);
  EXPECT_FALSE(state.ready());
}

// A node keeps its client in a member that its callbacks use (the attention node's Tick); the
// first callback can come right after registering, so the client must not start before Start.
TEST(CoordinatorProcessTest, ACallbackRunsOnlyAfterStartSoItMayUseTheClient) {
  auto process = CoordinatorProcess::Start(TestOptions());
  ASSERT_TRUE(process.ok()) << process.status();
  CoordinatorClientOptions options;
  options.coordinator_address = Address((*process)->port());
  options.node = NodeOf(pb::ROLE_ATTENTION, 0);
  CoordinatorClient* owner_view = nullptr;  // what the owner's member holds
  std::atomic<bool> saw_client{false};
  absl::Notification got_state;
  CoordinatorCallbacks callbacks;
  callbacks.on_cluster_state = [&](const pb::ClusterState&) {
    if (owner_view != nullptr && owner_view->WaitRegistered(absl::InfinitePast()).ok()) {
      saw_client = true;
    }
    got_state.Notify();
  };
  auto client = std::make_unique<CoordinatorClient>(options, std::move(callbacks));
  EXPECT_FALSE(client->WaitRegistered(absl::Now() + absl::Milliseconds(500)).ok())
      << "registered before Start";
  EXPECT_FALSE(got_state.HasBeenNotified());
  owner_view = client.get();
  client->Start();
  ASSERT_TRUE(got_state.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(saw_client);
  client->Stop();
}

TEST(CoordinatorProcessTest, DrainReachesTheNodeThroughItsHeartbeat) {
  auto process = CoordinatorProcess::Start(TestOptions());
  ASSERT_TRUE(process.ok()) << process.status();
  absl::Notification drained;
  CoordinatorCallbacks callbacks;
  callbacks.on_drain = [&drained] { drained.Notify(); };
  auto attention = StartClient((*process)->port(), pb::ROLE_ATTENTION, 0, callbacks);
  const uint32_t id = attention->WaitRegistered(absl::Now() + absl::Seconds(5)).value();

  auto stub = Stub((*process)->port());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  pb::DrainRequest request;
  request.set_node_id(id + 100);
  pb::DrainResponse response;
  EXPECT_EQ(stub->Drain(&context, request, &response).error_code(), grpc::NOT_FOUND);
  grpc::ClientContext context2;
  context2.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  request.set_node_id(id);
  ASSERT_TRUE(stub->Drain(&context2, request, &response).ok());
  EXPECT_TRUE(drained.WaitForNotificationWithTimeout(absl::Seconds(3)));
  EXPECT_TRUE(FindMember(GetState(stub.get()), id)->draining());
}

// The ids of the device channels in the last cluster state a client's callback saw.
class SeenChannels {
 public:
  void On(const pb::ClusterState& state) {
    absl::MutexLock lock(&mu_);
    ids_.clear();
    for (const pb::DeviceChannel& c : state.device_channels()) ids_.push_back(c.id());
  }
  std::vector<uint64_t> ids() {
    absl::MutexLock lock(&mu_);
    return ids_;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
};

TEST(CoordinatorProcessTest, DeviceChannelsReachTheNodesAndABrokenReportReplacesOne) {
  CoordinatorMainOptions options = TestOptions();
  std::atomic<int> generated{0};
  options.coordinator.nccl_unique_id_generator = [&generated]() -> absl::StatusOr<std::string> {
    return absl::StrCat("unique-", ++generated);
  };
  auto process = CoordinatorProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();

  SeenChannels attention_seen, expert_seen;
  std::atomic<bool> report{false};
  auto start = [&](pb::Role role, const std::string& gpu, SeenChannels* seen,
                   std::function<std::vector<uint64_t>()> broken) {
    CoordinatorClientOptions client;
    client.coordinator_address = Address((*process)->port());
    client.node = NodeOf(role, role == pb::ROLE_EXPERT ? 4 : 0);
    client.node.set_gpu_uuid(gpu);
    client.max_backoff = absl::Milliseconds(200);
    client.take_broken_device_channels = std::move(broken);
    CoordinatorCallbacks callbacks;
    callbacks.on_cluster_state = [seen](const pb::ClusterState& state) { seen->On(state); };
    auto c = std::make_unique<CoordinatorClient>(client, std::move(callbacks));
    c->Start();
    return c;
  };
  auto attention = start(pb::ROLE_ATTENTION, "GPU-A", &attention_seen, nullptr);
  auto expert = start(pb::ROLE_EXPERT, "GPU-B", &expert_seen, [&report] {
    return report.exchange(false) ? std::vector<uint64_t>{1} : std::vector<uint64_t>{};
  });
  const std::vector<uint64_t> first = {1, 2};
  ASSERT_TRUE(WaitFor([&] { return attention_seen.ids() == first && expert_seen.ids() == first; }))
      << "attention saw " << attention_seen.ids().size() << ", expert " << expert_seen.ids().size();

  // The expert node's next heartbeat reports channel 1 broken: both nodes get its replacement.
  report = true;
  const std::vector<uint64_t> second = {2, 3};
  ASSERT_TRUE(
      WaitFor([&] { return attention_seen.ids() == second && expert_seen.ids() == second; }));
  auto stub = Stub((*process)->port());
  const pb::ClusterState state = GetState(stub.get());
  ASSERT_EQ(state.device_channels_size(), 2);
  const uint32_t attention_id = attention->WaitRegistered(absl::Now()).value();
  EXPECT_EQ(state.device_channels(1).sender(), attention_id);
  EXPECT_EQ(state.device_channels(1).nccl_unique_id(), "unique-3");
  EXPECT_EQ(generated.load(), 3);
}

TEST(CoordinatorProcessTest, ARestartedCoordinatorRelearnsTheClusterFromItsNodes) {
  CoordinatorMainOptions options = TestOptions();
  auto first = CoordinatorProcess::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  std::vector<std::unique_ptr<CoordinatorClient>> nodes;
  nodes.push_back(StartClient(port, pb::ROLE_ATTENTION));
  nodes.push_back(StartClient(port, pb::ROLE_ROUTER));
  nodes.push_back(StartClient(port, pb::ROLE_EXPERT, 4));
  nodes.push_back(StartClient(port, pb::ROLE_EXPERT, 4));
  auto stub = Stub(port);
  const pb::ClusterState before =
      WaitForState(stub.get(), [](const auto& s) { return s.ready(); });
  ASSERT_TRUE(before.ready()) << before.not_ready_reason();
  // Every node has seen the placement before the coordinator goes away.
  for (auto& node : nodes) {
    ASSERT_TRUE(WaitFor([&] { return node->cluster_state().placement().version() == 1; }));
  }
  (*first)->Shutdown();
  first->reset();

  options.node.port = port;
  options.coordinator.recovery_window = absl::Milliseconds(400);
  auto second = CoordinatorProcess::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  auto stub2 = Stub(port);
  const pb::ClusterState after =
      WaitForState(stub2.get(), [](const auto& s) { return s.ready(); });
  ASSERT_TRUE(after.ready()) << after.not_ready_reason();
  EXPECT_EQ(after.placement().SerializeAsString(), before.placement().SerializeAsString());
  ASSERT_EQ(after.members_size(), before.members_size());
  for (int i = 0; i < before.members_size(); ++i) {
    EXPECT_EQ(after.members(i).node().node_id(), before.members(i).node().node_id());
    EXPECT_EQ(after.members(i).node().role(), before.members(i).node().role());
    EXPECT_EQ(after.members(i).node().incarnation(), before.members(i).node().incarnation());
    EXPECT_EQ(after.members(i).state(), pb::ALIVE);
  }
  // New nodes get fresh ids.
  auto late = StartClient(port, pb::ROLE_ROUTER);
  const uint32_t late_id = late->WaitRegistered(absl::Now() + absl::Seconds(5)).value();
  for (const pb::Member& m : before.members()) EXPECT_GT(late_id, m.node().node_id());
}

// A coordinator restarted with the flags of a fresh cluster (no recovery window, as `k3serve local`
// runs it) sees nodes re-register one by one. No node is handed the partial states of that
// time: acting on them would drop the links and workers of members not back yet.
TEST(CoordinatorProcessTest, NodesNeverActOnTheStateOfACoordinatorStillRelearningThem) {
  CoordinatorMainOptions options = TestOptions();
  auto first = CoordinatorProcess::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  struct Seen {
    absl::Mutex mu;
    int states = 0;
    int most_members = 0;
    int fewest_after_most = 1 << 30;  // the fewest members of a state after the most were seen
    bool recovering = false;          // a state marked recovering reached the node
  };
  std::vector<std::unique_ptr<Seen>> seen;
  std::vector<std::unique_ptr<CoordinatorClient>> nodes;
  const std::vector<std::pair<pb::Role, int>> roles = {
      {pb::ROLE_ATTENTION, 0}, {pb::ROLE_ROUTER, 0}, {pb::ROLE_EXPERT, 4}, {pb::ROLE_EXPERT, 4}};
  for (const auto& [role, slots] : roles) {
    seen.push_back(std::make_unique<Seen>());
    Seen* mine = seen.back().get();
    CoordinatorCallbacks callbacks;
    callbacks.on_cluster_state = [mine](const pb::ClusterState& state) {
      absl::MutexLock lock(&mine->mu);
      ++mine->states;
      mine->recovering |= state.recovering();
      const int members = state.members_size();
      if (members >= mine->most_members) {
        mine->most_members = members;
      } else {
        mine->fewest_after_most = std::min(mine->fewest_after_most, members);
      }
    };
    nodes.push_back(StartClient(port, role, slots, std::move(callbacks)));
  }
  for (auto& node : nodes) {
    ASSERT_TRUE(WaitFor([&] { return node->cluster_state().members_size() == 4; }));
  }
  (*first)->Shutdown();
  first->reset();

  options.node.port = port;
  auto second = CoordinatorProcess::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  auto stub = Stub(port);
  const pb::ClusterState after = WaitForState(stub.get(), [](const pb::ClusterState& s) {
    return s.ready() && !s.recovering() && s.members_size() == 4;
  });
  ASSERT_TRUE(after.ready()) << after.not_ready_reason();
  // Every node takes the relearned state (its members_version restarted from scratch).
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_TRUE(WaitFor([&] {
      return nodes[i]->cluster_state().members_version() == GetState(stub.get()).members_version();
    })) << "node " << i;
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    absl::MutexLock lock(&seen[i]->mu);
    EXPECT_FALSE(seen[i]->recovering) << "node " << i;
    EXPECT_EQ(seen[i]->most_members, 4) << "node " << i;
    EXPECT_EQ(seen[i]->fewest_after_most, 1 << 30)
        << "node " << i << " was handed a state with only " << seen[i]->fewest_after_most
        << " members";
  }
}

}  // namespace
}  // namespace k3
