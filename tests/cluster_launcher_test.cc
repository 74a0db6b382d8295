// The local cluster launcher itself (LocalCluster and `k3serve local`): bad options are refused
// before anything starts, a node that dies during startup is named with its log, Ctrl-C stops
// every process cleanly, a SIGKILLed launcher leaves no orphans, processes killed while it serves
// are restarted (and it gives up on one that keeps dying), and --prompt prints the tokens the
// single-process engine generates.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/grpc_server.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "launcher/local_cluster.h"
#include "proto/cluster.grpc.pb.h"
#include "tests/cluster_testing.h"

extern char** environ;

namespace k3 {
namespace {

// True once `pid` is gone (or a zombie waiting for a parent that is not us).
bool Gone(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

bool AllGoneWithin(const std::vector<pid_t>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    bool all = true;
    for (pid_t pid : pids) all &= Gone(pid);
    if (all) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// `k3serve local ...` as a child of the test: stdout through a pipe, stderr into a file.
class LocalCommand {
 public:
  explicit LocalCommand(const std::vector<std::string>& args) {
    stderr_path_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/local-", counter_++, ".stderr");
    int out[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, stderr_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> argv = {std::filesystem::absolute("k3serve").string(), "local"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, cargv[0], &actions, nullptr, cargv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    out_ = out[0];
  }

  ~LocalCommand() {
    if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }

  // The next stdout line, or "" at EOF or after `timeout`.
  std::string ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (buffer_.find('\n') == std::string::npos) {
      pollfd p = {out_, POLLIN, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (ms <= 0 || poll(&p, 1, ms) != 1) return "";
      char chunk[512];
      const ssize_t n = read(out_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, n);
    }
    const size_t eol = buffer_.find('\n');
    std::string line = buffer_.substr(0, eol);
    buffer_.erase(0, eol + 1);
    return line;
  }

  // Exit status (128 + signal when killed), or -1 if still running after `timeout`.
  int Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() >= deadline) return -1;
      absl::SleepFor(absl::Milliseconds(20));
    }
    pid_ = -1;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  // The pids of the nodes it reported starting on stderr.
  std::vector<pid_t> NodePids() const {
    std::ifstream file(stderr_path_);
    std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::vector<pid_t> pids;
    static const std::regex kStarted(R"(started \S+ \(pid (\d+)\))");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kStarted);
         it != std::sregex_iterator(); ++it) {
      pids.push_back(std::stoi((*it)[1]));
    }
    return pids;
  }

  struct Started {
    pid_t pid = -1;
    std::string address;  // gRPC host:port
  };
  // The latest start of each node it reported on stderr, by node name.
  std::map<std::string, Started> LatestStarts() const {
    const std::string text = Stderr();
    std::map<std::string, Started> starts;
    static const std::regex kStarted(R"(started (\S+) \(pid (\d+)\) on ([^,\s]+))");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kStarted);
         it != std::sregex_iterator(); ++it) {
      starts[(*it)[1]] = {std::stoi((*it)[2]), (*it)[3]};
    }
    return starts;
  }

  std::string Stderr() const {
    std::ifstream file(stderr_path_);
    return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  }

  pid_t pid() const { return pid_; }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  std::string stderr_path_;
};

// No child of the test is left, running or unreaped.
bool NoChildren() { return waitpid(-1, nullptr, WNOHANG) == -1 && errno == ECHILD; }

TEST(LocalClusterTest, RefusesBadOptionsBeforeStartingAnything) {
  const std::string model = RandomCheckpointDir("k3-tiny", 7);  // 32 experts
  struct Bad {
    const char* why;
    LocalClusterOptions options;
  };
  std::vector<Bad> bad;
  bad.push_back({"slots short of the experts", TestClusterOptions(model, 1, 1, 2, {8, 8})});
  bad.push_back({"slot count differs from nodes", TestClusterOptions(model, 1, 1, 2, {32})});
  bad.push_back({"no router", TestClusterOptions(model, 1, 0, 1)});
  bad.push_back({"no experts for an MoE model", TestClusterOptions(model, 1, 1, 0)});
  bad.push_back({"no checkpoint", TestClusterOptions(std::getenv("TEST_TMPDIR"), 1, 1, 1)});
  LocalClusterOptions missing_binary = TestClusterOptions(model, 1, 1, 1);
  missing_binary.binary = "/nonexistent/k3serve";
  bad.push_back({"missing binary", missing_binary});
  for (const Bad& b : bad) {
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(b.options);
    EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument)
        << b.why << ": " << cluster.status();
  }
  EXPECT_TRUE(NoChildren());
}

TEST(LocalClusterTest, NodeDyingDuringStartupIsNamedWithItsLogAndTheRestIsStopped) {
  LocalClusterOptions options = TestClusterOptions(RandomCheckpointDir("k3-tiny", 7), 1, 1, 2);
  options.extra_args[NodeRole::kExpert] = {"--no-such-flag=1"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok());
  const std::string message(cluster.status().message());
  EXPECT_NE(message.find("expert-"), std::string::npos) << message;
  EXPECT_NE(message.find("no-such-flag"), std::string::npos) << "no log tail: " << message;
  EXPECT_TRUE(NoChildren()) << "processes left behind";
}

// A listening socket on a free port of 127.0.0.1, held until destroyed.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa = {};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        listen(fd_, 1) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      ADD_FAILURE() << "cannot hold a port: " << strerror(errno);
      return;
    }
    port_ = ntohs(sa.sin_port);
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Another process may bind a port between the launcher picking it and the node binding it (seen
// in CI with tests running side by side). The node then cannot start; the launcher sees the port
// held, starts the node again on fresh ports (the coordinator before anyone learnt its address),
// and the cluster comes up and serves.
TEST(LocalClusterTest, ANodeWhosePortWasTakenStartsAgainOnAnother) {
  const std::string model = RandomCheckpointDir("k3-tiny", 7);
  HeldPort coordinator_port, attention_port, expert_port;
  ASSERT_GT(coordinator_port.port(), 0);
  ASSERT_GT(attention_port.port(), 0);
  ASSERT_GT(expert_port.port(), 0);
  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 1);
  options.http_port = 0;  // a front started with the attention node's first address
  bool taken = false;
  options.pick_ports = [&](int n) -> absl::StatusOr<std::vector<int>> {
    std::vector<int> ports;
    for (int i = 0; i < n; ++i) {
      HeldPort fresh;  // free now; released when this loop iteration ends
      ports.push_back(fresh.port());
    }
    // The call that picks every node's gRPC ports (coordinator, attention, router, expert,
    // http; the front's HTTP port is picked alone first): three of them are taken.
    if (n >= 5 && !taken) {
      taken = true;
      ports[0] = coordinator_port.port();
      ports[1] = attention_port.port();
      ports[3] = expert_port.port();
    }
    return ports;
  };
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string taken_coordinator = absl::StrCat("127.0.0.1:", coordinator_port.port());
  const std::string taken_attention = absl::StrCat("127.0.0.1:", attention_port.port());
  const std::string taken_expert = absl::StrCat("127.0.0.1:", expert_port.port());
  EXPECT_TRUE(taken);
  EXPECT_NE((*cluster)->coordinator_address(), taken_coordinator);
  for (const LocalCluster::Node& node : (*cluster)->nodes()) {
    EXPECT_NE(node.grpc_address, taken_attention);
    EXPECT_NE(node.grpc_address, taken_expert);
  }
  const std::string said = absl::StrJoin(lines, "\n");
  EXPECT_NE(said.find("attention-0 could not listen on " + taken_attention), std::string::npos)
      << said;
  EXPECT_NE(said.find("coordinator could not listen on " + taken_coordinator), std::string::npos)
      << said;
  EXPECT_NE(said.find("expert-0 could not listen on " + taken_expert), std::string::npos) << said;

  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, {prompt}, 3);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
      (*cluster)->generate_addresses()[0], GreedyRequest("taken", prompt, 3), absl::Seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, (*expected)[0]);
  // The HTTP front, started again with the attention node's new address, answers.
  const std::string http = (*cluster)->http_address();
  const size_t colon = http.rfind(':');
  httplib::Client client(http.substr(0, colon), std::stoi(http.substr(colon + 1)));
  httplib::Result completion = client.Post(
      "/v1/completions", R"({"prompt":[3,1,4,1,5],"max_tokens":3,"temperature":0})",
      "application/json");
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->status, 200) << completion->body;

  // Each router and expert node got its share of this machine's threads, the attention node all
  // of them (LocalClusterOptions::node_threads), unless the environment already names a count.
  const char* inherited = std::getenv("K3SERVE_THREADS");
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  for (const LocalCluster::Node& node : (*cluster)->nodes()) {
    if (node.role == NodeRole::kCoordinator || node.role == NodeRole::kHttp) continue;
    const std::string want =
        inherited != nullptr ? std::string(inherited)
                             : absl::StrCat(node.role == NodeRole::kAttention
                                                ? hardware
                                                : SplitKernelThreads(hardware, 3));
    std::ifstream environ_file(absl::StrCat("/proc/", node.pid, "/environ"));
    std::string all((std::istreambuf_iterator<char>(environ_file)), {});
    const std::vector<std::string> entries = absl::StrSplit(all, '\0');
    EXPECT_NE(std::find(entries.begin(), entries.end(), "K3SERVE_THREADS=" + want), entries.end())
        << node.name;
  }
  EXPECT_TRUE((*cluster)->Stop().ok());
}

TEST(LocalClusterTest, KernelThreadsAreSplitEvenlyAmongTheDataPlaneNodes) {
  EXPECT_EQ(SplitKernelThreads(2, 4), 1);  // A1 R1 E2 on this CI machine
  EXPECT_EQ(SplitKernelThreads(16, 4), 4);
  EXPECT_EQ(SplitKernelThreads(16, 3), 5);
  EXPECT_EQ(SplitKernelThreads(1, 1), 1);
  EXPECT_EQ(SplitKernelThreads(8, 0), 8);
}

// Start-up and shutdown races show only now and then (an attention node once crashed right after
// registering, when its first cluster-state callback ran before the node had stored its
// coordinator client): clusters started and stopped many times in a row must each come up, answer
// with the single-process tokens and stop cleanly (every node exits 0 on SIGTERM). Bounded: after
// kMinRuns, a spent time budget ends the loop early.
TEST(LocalClusterTest, StartsAndStopsCleanlyManyTimesInARow) {
  constexpr int kRuns = 10;
  constexpr int kMinRuns = 3;
  constexpr absl::Duration kBudget = absl::Seconds(120);
  constexpr int kTokens = 3;
  const std::string model = RandomCheckpointDir("kimi-linear-tiny", 5);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, {prompt}, kTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const absl::Time deadline = absl::Now() + kBudget;
  int runs = 0;
  for (; runs < kRuns && (runs < kMinRuns || absl::Now() < deadline); ++runs) {
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::Start(TestClusterOptions(model, /*attention=*/2, /*routers=*/1,
                                               /*experts=*/2, {6, 10}));
    ASSERT_TRUE(cluster.ok()) << "run " << runs << ": " << cluster.status();
    for (const std::string& address : (*cluster)->generate_addresses()) {
      absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
          address, GreedyRequest(absl::StrCat("run-", runs), prompt, kTokens), absl::Seconds(30));
      ASSERT_TRUE(outcome.ok()) << "run " << runs << " at " << address << ": " << outcome.status();
      EXPECT_EQ(outcome->tokens, (*expected)[0]) << "run " << runs << " at " << address;
    }
    const absl::Status stopped = (*cluster)->Stop();
    ASSERT_TRUE(stopped.ok()) << "run " << runs << ": " << stopped;
  }
  std::cerr << runs << " clusters started and stopped cleanly" << std::endl;
  EXPECT_TRUE(NoChildren()) << "processes left behind";
}

TEST(LocalCommandTest, InterruptStopsEveryProcessCleanly) {
  LocalCommand local(
      {"--model", RandomCheckpointDir("k3-tiny", 7), "--experts", "2", "--routers", "2"});
  const std::string line = local.ReadLine(absl::Seconds(60));
  ASSERT_EQ(line.rfind("generate address: 127.0.0.1:", 0), 0u) << line << "\n" << local.Stderr();
  // The launcher prints the HTTP front's address after the attention nodes', then every
  // process's metrics address.
  EXPECT_EQ(local.ReadLine(absl::Seconds(5)).rfind("http address: 127.0.0.1:", 0), 0u);
  EXPECT_EQ(local.ReadLine(absl::Seconds(5)).rfind("front generate address: 127.0.0.1:", 0), 0u);
  const std::vector<pid_t> nodes = local.NodePids();
  ASSERT_EQ(nodes.size(), 7u) << local.Stderr();  // with the HTTP front
  std::vector<std::string> metrics_nodes;
  std::string attention_metrics;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> words = absl::StrSplit(local.ReadLine(absl::Seconds(5)), ' ');
    ASSERT_EQ(words.size(), 4u) << absl::StrJoin(words, " ");
    EXPECT_EQ(words[0] + " " + words[1], "metrics address:");
    EXPECT_EQ(words[3].rfind("127.0.0.1:", 0), 0u) << words[3];
    metrics_nodes.push_back(words[2]);
    if (words[2] == "attention-0") attention_metrics = words[3];
  }
  EXPECT_EQ(metrics_nodes,
            (std::vector<std::string>{"coordinator", "attention-0", "router-0", "router-1",
                                      "expert-0", "expert-1", "http-0"}));
  // The attention worker's metrics have the latency histograms users expect.
  std::vector<std::string> port = absl::StrSplit(attention_metrics, ':');
  ASSERT_EQ(port.size(), 2u);
  httplib::Client client("127.0.0.1", std::stoi(port[1]));
  client.set_connection_timeout(2);
  httplib::Result scraped = client.Get("/metrics");
  ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
  EXPECT_EQ(scraped->status, 200);
  for (const char* name :
       {"k3_attention_time_to_first_token_seconds_count", "k3_attention_inter_token_seconds_count",
        "k3_attention_request_seconds_count"}) {
    EXPECT_NE(scraped->body.find(name), std::string::npos) << name;
  }
  kill(local.pid(), SIGINT);
  EXPECT_EQ(local.Wait(absl::Seconds(20)), 0) << local.Stderr();
  EXPECT_TRUE(AllGoneWithin(nodes, absl::Seconds(1)));
  EXPECT_EQ(local.Stderr().find("unclean stop"), std::string::npos) << local.Stderr();
}

TEST(LocalCommandTest, KilledLauncherLeavesNoOrphans) {
  LocalCommand local({"--model", RandomCheckpointDir("k3-tiny", 7)});
  const std::string line = local.ReadLine(absl::Seconds(60));
  ASSERT_EQ(line.rfind("generate address: ", 0), 0u) << line << "\n" << local.Stderr();
  const std::vector<pid_t> nodes = local.NodePids();
  ASSERT_EQ(nodes.size(), 5u) << local.Stderr();  // with the HTTP front
  kill(local.pid(), SIGKILL);
  EXPECT_EQ(local.Wait(absl::Seconds(5)), 128 + SIGKILL);
  EXPECT_TRUE(AllGoneWithin(nodes, absl::Seconds(2))) << "orphaned cluster processes";
}

namespace pb = k3serve::cluster::v1;

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

absl::StatusOr<pb::ClusterState> ClusterStateAt(const std::string& coordinator) {
  auto stub = pb::Coordinator::NewStub(Channel(coordinator));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  pb::ClusterState state;
  const grpc::Status status = stub->GetClusterState(&context, pb::GetClusterStateRequest(), &state);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return state;
}

// Supervision: an expert worker and a router killed with SIGKILL while `k3serve local` serves are
// started again (same flags and ports) after the logged backoff; the coordinator shows the new
// processes ALIVE, every node is ready again, and requests give the single-process tokens.
TEST(LocalCommandTest, KilledProcessesAreRestartedAndServeAgain) {
  const std::string model = RandomCheckpointDir("k3-tiny", 7);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  constexpr int kTokens = 6;
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, {prompt}, kTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  LocalCommand local({"--model", model, "--routers", "2", "--experts", "2", "--no-metrics",
                      "--http-port", "-1"});
  const std::string line = local.ReadLine(absl::Seconds(60));
  ASSERT_EQ(line.rfind("generate address: ", 0), 0u) << line << "\n" << local.Stderr();
  const std::string generate = line.substr(std::string("generate address: ").size());
  const std::map<std::string, LocalCommand::Started> before = local.LatestStarts();
  ASSERT_EQ(before.size(), 6u) << local.Stderr();

  const absl::Time killed = absl::Now();
  for (const char* victim : {"expert-1", "router-1"}) {
    ASSERT_EQ(kill(before.at(victim).pid, SIGKILL), 0) << victim;
  }
  // Both come back as new processes on the same ports, and the launcher says so.
  std::map<std::string, LocalCommand::Started> after;
  ASSERT_TRUE(WaitFor(
      [&] {
        after = local.LatestStarts();
        return after.at("expert-1").pid != before.at("expert-1").pid &&
               after.at("router-1").pid != before.at("router-1").pid;
      },
      absl::Seconds(10)))
      << local.Stderr();
  for (const char* victim : {"expert-1", "router-1"}) {
    EXPECT_EQ(after.at(victim).address, before.at(victim).address) << victim;
    EXPECT_NE(local.Stderr().find(absl::StrCat("restarting ", victim,
                                               " (exit: killed by signal 9), attempt 1 in 200 ms")),
              std::string::npos)
        << local.Stderr();
  }
  // The coordinator has the new processes ALIVE (the new expert in the placement, in place of the
  // dead one), and every node says it is ready.
  const std::map<std::string, std::string> readiness = {
      {"attention-0", "k3serve.v1.K3Serve"},
      {"router-0", "k3serve.cluster.v1.RouterControl"},
      {"router-1", "k3serve.cluster.v1.RouterControl"},
      {"expert-0", "k3serve.cluster.v1.ExpertWorker"},
      {"expert-1", "k3serve.cluster.v1.ExpertWorker"}};
  std::string why = "not checked";
  const bool recovered = WaitFor(
      [&] {
        absl::StatusOr<pb::ClusterState> state = ClusterStateAt(after.at("coordinator").address);
        if (!state.ok()) return (why = state.status().ToString()), false;
        if (!state->ready()) return (why = state->not_ready_reason()), false;
        std::map<pid_t, std::pair<pb::MemberState, uint32_t>> by_pid;
        for (const pb::Member& m : state->members()) {
          by_pid[m.node().pid()] = {m.state(), m.node().node_id()};
        }
        for (const char* node : {"expert-1", "router-1"}) {
          auto it = by_pid.find(after.at(node).pid);
          if (it == by_pid.end() || it->second.first != pb::ALIVE) {
            return (why = absl::StrCat(node, " is not an ALIVE member yet")), false;
          }
        }
        const auto& workers = state->placement().worker_node_ids();
        if (std::find(workers.begin(), workers.end(),
                      by_pid[after.at("expert-1").pid].second) == workers.end()) {
          return (why = "the new expert-1 holds no experts yet"), false;
        }
        for (const auto& [node, service] : readiness) {
          absl::StatusOr<bool> serving =
              CheckServing(Channel(after.at(node).address), service, absl::Seconds(1));
          if (!serving.ok() || !*serving) return (why = absl::StrCat(node, " not ready")), false;
        }
        return true;
      },
      absl::Seconds(30));
  ASSERT_TRUE(recovered) << why << "\n" << local.Stderr();
  std::cerr << "serving again " << absl::FormatDuration(absl::Now() - killed)
            << " after the kills" << std::endl;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
        generate, GreedyRequest(absl::StrCat("after-restart-", i), prompt, kTokens),
        absl::Seconds(30));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->tokens, (*expected)[0]);
  }
  kill(local.pid(), SIGINT);
  EXPECT_EQ(local.Wait(absl::Seconds(20)), 0) << local.Stderr();
  EXPECT_TRUE(AllGoneWithin(local.NodePids(), absl::Seconds(1)));
}

// A process that keeps dying right after each restart makes the launcher give up: a clear message,
// the cluster stopped, exit status 1.
TEST(LocalCommandTest, GivesUpOnAProcessThatKeepsDying) {
  LocalCommand local({"--model", RandomCheckpointDir("k3-tiny", 7), "--no-metrics",
                      "--http-port", "-1", "--max-restarts", "2"});
  const std::string line = local.ReadLine(absl::Seconds(60));
  ASSERT_EQ(line.rfind("generate address: ", 0), 0u) << line << "\n" << local.Stderr();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const pid_t pid = local.LatestStarts().at("expert-0").pid;
    ASSERT_EQ(kill(pid, SIGKILL), 0) << "attempt " << attempt;
    if (attempt == 3) break;
    ASSERT_TRUE(WaitFor([&] { return local.LatestStarts().at("expert-0").pid != pid; },
                        absl::Seconds(10)))
        << local.Stderr();
  }
  EXPECT_EQ(local.Wait(absl::Seconds(30)), 1) << local.Stderr();
  const std::string err = local.Stderr();
  EXPECT_NE(err.find("attempt 2 in 400 ms"), std::string::npos) << err;
  EXPECT_NE(err.find("expert-0 died again (exit: killed by signal 9) after 2 restarts in a row"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("giving up"), std::string::npos) << err;
  EXPECT_TRUE(AllGoneWithin(local.NodePids(), absl::Seconds(1)));
}

TEST(LocalCommandTest, PromptPrintsTheSingleProcessTokens) {
  const std::string model = RandomCheckpointDir("kimi-linear-tiny", 5);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, {prompt}, 9);
  ASSERT_TRUE(expected.ok()) << expected.status();
  LocalCommand local({"--model", model, "--experts", "2", "--expert-slots", "6,10", "--prompt",
                      absl::StrJoin(prompt, ","), "--max-new-tokens", "9"});
  EXPECT_EQ(local.ReadLine(absl::Seconds(60)).rfind("generate address: ", 0), 0u) << local.Stderr();
  EXPECT_EQ(local.ReadLine(absl::Seconds(30)), absl::StrJoin((*expected)[0], " "))
      << local.Stderr();
  EXPECT_EQ(local.Wait(absl::Seconds(20)), 0) << local.Stderr();
  EXPECT_TRUE(AllGoneWithin(local.NodePids(), absl::Seconds(1)));
}

// An HTTP port the user chose is theirs: taken, it is an error naming it, not another port.
TEST(LocalClusterTest, ATakenExplicitHttpPortIsAnError) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  LocalClusterOptions options = TestClusterOptions(RandomCheckpointDir("k3-tiny", 7), 1, 1, 1);
  options.http_port = held.port();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok()) << "started with its front on another port than " << held.port();
  EXPECT_NE(cluster.status().message().find(absl::StrCat(held.port())), std::string::npos)
      << cluster.status();
}

// SIGTERM to `k3serve local` with streams in flight: the attention worker stops admitting and
// lets them run until its drain deadline, then ends the rest; every stream either gets all its
// tokens or ends with UNAVAILABLE "the server is shutting down", never a broken stream.
TEST(LocalCommandTest, SigtermEndsEveryStreamInFlightCleanly) {
  LocalCommand local({"--model", RandomCheckpointDir("k3-tiny", 7), "--experts", "2",
                      "--stop-grace-ms", "6000"});
  const std::string line = local.ReadLine(absl::Seconds(60));
  ASSERT_EQ(line.rfind("generate address: ", 0), 0u) << line << "\n" << local.Stderr();
  const std::string address = line.substr(std::string("generate address: ").size());
  constexpr int kStreams = 6;
  std::vector<absl::StatusOr<GenerateOutcome>> outcomes(kStreams, absl::UnknownError("unset"));
  std::vector<int> want(kStreams);
  std::atomic<int> started{0};
  std::vector<std::thread> streams;
  for (int i = 0; i < kStreams; ++i) {
    want[i] = i % 2 == 0 ? 12 : 4000;  // short ones finish within the drain, long ones cannot
    streams.emplace_back([&, i] {
      bool counted = false;
      outcomes[i] = GenerateOverGrpc(
          address, GreedyRequest(absl::StrCat("stop-", i), {3, 1, 4, 1, 5, i}, want[i]),
          absl::Seconds(120), [&](absl::Span<const int32_t>) {
            if (!counted) started.fetch_add(1);
            counted = true;
          });
    });
  }
  ASSERT_TRUE(WaitFor([&] { return started.load() == kStreams; }, absl::Seconds(60)));
  kill(local.pid(), SIGTERM);
  for (std::thread& t : streams) t.join();
  EXPECT_EQ(local.Wait(absl::Seconds(60)), 0) << local.Stderr();
  for (int i = 0; i < kStreams; ++i) {
    if (outcomes[i].ok()) {
      EXPECT_EQ(static_cast<int>(outcomes[i]->tokens.size()), want[i]) << i;
    } else {
      EXPECT_TRUE(absl::IsUnavailable(outcomes[i].status())) << i << ": " << outcomes[i].status();
      EXPECT_NE(outcomes[i].status().message().find("shutting down"), std::string::npos)
          << i << ": " << outcomes[i].status();
    }
  }
  for (int i = 0; i < kStreams; i += 2) EXPECT_TRUE(outcomes[i].ok()) << outcomes[i].status();
}

}  // namespace
}  // namespace k3
