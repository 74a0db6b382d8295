// The router and expert node processes of //:k3serve against the single-process engine: this test
// runs a coordinator in-process, starts one router and two expert nodes with uneven slots (12 and
// 20 of k3-tiny's 32 experts), and plays the attention worker itself: it registers, sends
// MoeRequests over UCX and checks every MoeResponse against LocalRoutedMoe on the same rows. Then
// it SIGKILLs an expert node mid-stream (the next answer must be UNAVAILABLE naming it within 2 s),
// restarts it (the coordinator gives it the dead node's slot; answers must be right again), and
// stops everything with SIGTERM (clean exits, no process left behind).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/coordinator_client.h"
#include "coordinator/coordinator_main.h"
#include "cluster/grpc_server.h"
#include "cluster/ucx_transport.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "engine/local_routed_moe.h"
#include "moe/moe_layer_map.h"
#include "moe/moe_wire.h"
#include "tools/random_model_folder.h"

extern char** environ;

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr char kHost[] = "127.0.0.1";
constexpr int kSlotsA = 12;
constexpr int kSlotsB = 20;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A k3serve child process; SIGKILLed when destroyed unless it already exited.
class Child {
 public:
  // Starts `k3serve args...` with output to `log`. Dies with the test (PR_SET_PDEATHSIG).
  static std::unique_ptr<Child> Start(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv_strings = {std::filesystem::absolute("k3serve").string()};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return nullptr;
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      dup2(fd, 1);
      dup2(fd, 2);
      execve(argv[0], argv.data(), environ);
      _exit(127);
    }
    close(fd);
    if (pid < 0) return nullptr;
    return std::unique_ptr<Child>(new Child(pid, log));
  }

  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }

  void Kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // SIGTERM, then the exit status within `grace` (-1 if it had to be SIGKILLed).
  int Terminate(absl::Duration grace) {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    int status = 0;
    while (absl::Now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    Kill9();
    return -1;
  }

 private:
  Child(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}
  pid_t pid_;
  std::string log_;
};

class RouterExpertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Same-host peers use shared memory; tcp (for the liveness fallback) only on loopback.
    setenv("UCX_NET_DEVICES", "lo", 1);
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    model_dir_ = TmpDir() + "/router_expert_k3_tiny";
    ASSERT_TRUE(WriteRandomModelFolder(*config, 31, model_dir_).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(model_dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
        LoadWeights(*std::move(checkpoint), WeightSelection::All());
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);

    CoordinatorMainOptions options;
    options.node.host = kHost;
    options.coordinator.num_experts = config->num_experts;
    options.coordinator.num_moe_layers = config->NumMoeLayers();
    options.coordinator.expected_expert_nodes = 2;
    options.coordinator.heartbeat_interval = absl::Milliseconds(100);
    options.coordinator.heartbeat_timeout = absl::Milliseconds(600);
    options.coordinator.recovery_window = absl::ZeroDuration();
    options.shutdown_grace = absl::Milliseconds(200);
    // The test reads the router's load window itself before the coordinator gathers (and resets) it.
    options.balancing.gather_interval = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<CoordinatorProcess>> coordinator =
        CoordinatorProcess::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    coordinator_address_ = absl::StrCat(kHost, ":", coordinator_->port());
  }

  void TearDown() override {
    if (client_) client_->Stop();
    if (transport_) transport_->Close();
    for (auto& [name, child] : children_) {
      if (HasFailure()) std::cerr << "--- log of " << name << ": " << child->log() << "\n";
    }
    children_.clear();  // SIGKILLs whatever is left
    if (coordinator_) coordinator_->Shutdown();
  }

  Child* StartNode(const std::string& name, std::vector<std::string> args) {
    args.insert(args.end(), {"--coordinator", coordinator_address_, "--model", model_dir_,
                             "--host", kHost});
    std::unique_ptr<Child> child =
        Child::Start(args, absl::StrCat(TmpDir(), "/", name, "-", children_.size(), ".log"));
    EXPECT_NE(child, nullptr) << "cannot start " << name;
    Child* raw = child.get();
    children_[name] = std::move(child);
    return raw;
  }

  // Registers this test as the attention worker, waits for a ready cluster and connects its
  // router. Returns the router's gRPC address.
  std::string JoinAsAttention() {
    absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create();
    EXPECT_TRUE(transport.ok()) << transport.status();
    if (!transport.ok()) return "";
    transport_ = *std::move(transport);
    CoordinatorClientOptions options;
    options.coordinator_address = coordinator_address_;
    options.node.set_role(pb::ROLE_ATTENTION);
    options.node.set_grpc_address(absl::StrCat(kHost, ":1"));  // serves nothing
    options.node.set_transport_address(transport_->LocalAddress());
    client_ = std::make_unique<CoordinatorClient>(options, CoordinatorCallbacks());
    client_->Start();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    pb::ClusterState state;
    while (absl::Now() < deadline) {
      state = client_->cluster_state();
      if (state.ready()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(state.ready()) << state.not_ready_reason();
    for (const pb::Member& member : state.members()) {
      if (member.node().role() != pb::ROLE_ROUTER) continue;
      router_ = member.node().node_id();
      EXPECT_TRUE(transport_->Connect(router_, member.node().transport_address()).ok());
      // Ready once the router has the placement and reached both expert nodes.
      auto channel =
          grpc::CreateChannel(member.node().grpc_address(), grpc::InsecureChannelCredentials());
      bool serving = false;
      while (!serving && absl::Now() < deadline) {
        absl::StatusOr<bool> health =
            CheckServing(channel, "k3serve.cluster.v1.RouterControl", absl::Seconds(1));
        serving = health.ok() && *health;
        if (!serving) absl::SleepFor(absl::Milliseconds(20));
      }
      EXPECT_TRUE(serving) << "the router did not become ready";
      return member.node().grpc_address();
    }
    ADD_FAILURE() << "no router in the cluster state";
    return "";
  }

  // The member whose process is `pid`.
  pb::NodeInfo Member(pid_t pid) {
    const pb::ClusterState state = client_->cluster_state();
    for (const pb::Member& member : state.members()) {
      if (member.node().pid() == pid) return member.node();
    }
    ADD_FAILURE() << "no member with pid " << pid;
    return pb::NodeInfo();
  }

  std::vector<float> RandomRows(int64_t tokens, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> value(0.f, 1.f);
    std::vector<float> rows(tokens * weights_->config.hidden_size);
    for (float& v : rows) v = value(rng);
    return rows;
  }

  void Send(uint64_t step, int layer, const std::vector<float>& rows) {
    MoeRequest request;
    request.step_id = step;
    request.layer = layer;
    request.width = weights_->config.hidden_size;
    request.tokens = static_cast<int64_t>(rows.size()) / request.width;
    request.rows = rows;
    ASSERT_TRUE(transport_->Send(router_, Encode(request)).ok());
  }

  // The answer to `step`; earlier steps' late answers are skipped.
  MoeResponse Await(uint64_t step, absl::Duration wait) {
    const absl::Time deadline = absl::Now() + wait;
    for (;;) {
      MoeResponse response;
      absl::StatusOr<Received> received = transport_->Receive(deadline);
      if (!received.ok()) {
        response.status = received.status();
        return response;
      }
      if (received->kind != Received::Kind::kMessage) {
        response.status = received->error;
        return response;
      }
      EXPECT_TRUE(Decode(received->bytes, &response).ok());
      if (response.step_id == step) return response;
    }
  }

  // Max |got - want| relative to (1 + |want|) against LocalRoutedMoe; fails on shape errors.
  double ErrorVsLocal(const MoeResponse& response, int layer, const std::vector<float>& rows) {
    const int64_t tokens = static_cast<int64_t>(rows.size()) / weights_->config.hidden_size;
    LocalRoutedMoe local(weights_.get());
    EXPECT_TRUE(local.Begin(layer, rows.data(), tokens).ok());
    std::vector<float> want(tokens * weights_->config.ExpertWidth());
    EXPECT_TRUE(local.Wait(want.data()).ok());
    EXPECT_EQ(response.tokens, tokens);
    EXPECT_EQ(response.rows.size(), want.size());
    if (response.rows.size() != want.size()) return 1e9;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(response.rows[i] - want[i]) / (1.0 + std::abs(want[i])));
    }
    return worst;
  }

  std::string model_dir_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::string coordinator_address_;
  std::map<std::string, std::unique_ptr<Child>> children_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<CoordinatorClient> client_;
  PeerId router_ = 0;
};

TEST_F(RouterExpertTest, MatchesLocalEngineSurvivesAKilledExpertAndShutsDownCleanly) {
  const ModelConfig& config = weights_->config;
  Child* router = StartNode("router", {"router", "--step-timeout-ms", "5000", "--qb-bins", "10"});
  Child* expert_a = StartNode("expert-a", {"expert", "--slots", absl::StrCat(kSlotsA)});
  Child* expert_b = StartNode("expert-b", {"expert", "--slots", absl::StrCat(kSlotsB)});
  ASSERT_NE(router, nullptr);
  ASSERT_NE(expert_a, nullptr);
  ASSERT_NE(expert_b, nullptr);
  const std::string router_grpc = JoinAsAttention();
  ASSERT_FALSE(router_grpc.empty());

  // Every MoE layer, with token counts that reach both workers.
  uint64_t step = 1;
  int64_t routed_tokens = 0;
  for (int layer = config.first_k_dense_replace; layer < config.num_hidden_layers; ++layer) {
    const std::vector<float> rows = RandomRows(3 + 5 * layer, 1000 + layer);
    Send(step, layer, rows);
    MoeResponse response = Await(step++, absl::Seconds(10));
    ASSERT_TRUE(response.status.ok()) << "layer " << layer << ": " << response.status;
    EXPECT_LT(ErrorVsLocal(response, layer, rows), 1e-5) << "layer " << layer;
    routed_tokens += 3 + 5 * layer;
  }

  // The control RPCs: the router's load statistics count every routed token top_k times; each
  // expert node maps only its slice.
  {
    auto stub = pb::RouterControl::NewStub(
        grpc::CreateChannel(router_grpc, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::GetLoadStatsRequest request;
    pb::LoadStatsResponse stats;
    ASSERT_TRUE(stub->GetLoadStats(&context, request, &stats).ok());
    EXPECT_EQ(stats.window_tokens(), static_cast<uint64_t>(routed_tokens));
    uint64_t counted = 0;
    for (const pb::LayerLoadStats& layer : stats.layers()) {
      for (uint64_t c : layer.counts()) counted += c;
      EXPECT_EQ(layer.bins_size(), config.num_experts * 10);
    }
    EXPECT_EQ(counted, static_cast<uint64_t>(routed_tokens * config.num_experts_per_token));

    // The coordinator gathers the same window (and resets it), QB histograms included.
    auto coordinator = pb::Coordinator::NewStub(
        grpc::CreateChannel(coordinator_address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext report_context;
    report_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::GetLoadReportRequest report_request;
    report_request.set_refresh(true);
    pb::LoadReport report;
    ASSERT_TRUE(coordinator->GetLoadReport(&report_context, report_request, &report).ok());
    EXPECT_EQ(report.routers(), 1);
    EXPECT_EQ(report.routers_failed(), 0);
    ASSERT_EQ(report.layers_size(), config.NumMoeLayers());
    for (const pb::LayerLoadReport& layer : report.layers()) {
      const int model_layer = *ModelLayerOfMoe(config, layer.layer());
      EXPECT_EQ(layer.tokens(), static_cast<uint64_t>(3 + 5 * model_layer));
      EXPECT_EQ(layer.qb_bias_size(), config.num_experts);
    }
  }
  std::map<pid_t, int64_t> weight_bytes;
  for (Child* expert : {expert_a, expert_b}) {
    auto stub = pb::ExpertWorker::NewStub(grpc::CreateChannel(
        Member(expert->pid()).grpc_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::ExpertStatusResponse status;
    ASSERT_TRUE(stub->Status(&context, pb::ExpertStatusRequest(), &status).ok());
    const int slots = expert == expert_a ? kSlotsA : kSlotsB;
    ASSERT_EQ(status.hosted_size(), config.NumMoeLayers());
    EXPECT_EQ(status.hosted(0).expert_ids_size(), slots);
    EXPECT_GT(status.rows_processed(), 0);
    weight_bytes[expert->pid()] = status.weight_bytes();
    grpc::ClientContext load_context;
    load_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::LoadExpertsResponse loaded;
    // An empty request names no placement version.
    EXPECT_EQ(stub->LoadExperts(&load_context, pb::LoadExpertsRequest(), &loaded).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_GT(weight_bytes[expert_a->pid()], 0);
  EXPECT_EQ(weight_bytes[expert_a->pid()] * kSlotsB, weight_bytes[expert_b->pid()] * kSlotsA);

  // Kill -9 expert B with a step in flight: that step or the next fails naming B, quickly.
  const pb::NodeInfo lost = Member(expert_b->pid());
  const std::string lost_name =
      absl::StrCat("expert worker node ", lost.node_id(), " (pid ", lost.pid(), " on ",
                   lost.host(), ") lost");
  const std::vector<float> rows = RandomRows(40, 77);  // 40 tokens x 4 experts: both workers
  const int layer = config.first_k_dense_replace + 1;
  Send(step, layer, rows);
  expert_b->Kill9();
  const absl::Time killed = absl::Now();
  MoeResponse failed = Await(step++, absl::Seconds(10));
  if (failed.status.ok()) {  // B answered before it died; the next step must fail
    Send(step, layer, rows);
    failed = Await(step++, absl::Seconds(10));
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kUnavailable) << failed.status;
  EXPECT_NE(failed.status.message().find(lost_name), absl::string_view::npos) << failed.status;
  Send(step, layer, rows);
  MoeResponse fast = Await(step++, absl::Seconds(1));
  EXPECT_EQ(fast.status.code(), absl::StatusCode::kUnavailable) << fast.status;

  // Restart it: a new node that the coordinator hands the dead node's slot.
  Child* restarted = StartNode("expert-b-restarted", {"expert", "--slots", absl::StrCat(kSlotsB)});
  ASSERT_NE(restarted, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  MoeResponse recovered;
  while (absl::Now() < deadline) {
    Send(step, layer, rows);
    recovered = Await(step++, absl::Seconds(10));
    if (recovered.status.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(recovered.status.ok()) << recovered.status;
  EXPECT_LT(ErrorVsLocal(recovered, layer, rows), 1e-5);
  std::cerr << "recovered " << absl::FormatDuration(absl::Now() - killed) << " after the kill\n";
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> more = RandomRows(17, 200 + i);
    Send(step, layer + i, more);
    MoeResponse response = Await(step++, absl::Seconds(10));
    ASSERT_TRUE(response.status.ok()) << response.status;
    EXPECT_LT(ErrorVsLocal(response, layer + i, more), 1e-5);
  }

  // SIGTERM: every node leaves and exits 0.
  EXPECT_EQ(router->Terminate(absl::Seconds(10)), 0);
  EXPECT_EQ(expert_a->Terminate(absl::Seconds(10)), 0);
  EXPECT_EQ(restarted->Terminate(absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace k3
