// The local cluster launcher itself (LocalCluster and `k3serve local`): bad options are refused
// before anything starts, a node that dies during startup is named with its log, Ctrl-C stops
// every process cleanly, a SIGKILLed launcher leaves no orphans, and --prompt prints the tokens
// the single-process engine generates.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "launcher/local_cluster.h"
#include "attention_nodes/generate_client.h"
#include "launcher/local_cluster.h"
#include "gtest/gtest.h"
#include "httplib.h"
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

}  // namespace
}  // namespace k3
