// One fault must cost no request on `k3serve local`'s default topology (issue 37): one attention
// worker, one router, one expert worker (k3-tiny over UCX, real processes), so there is no replica
// and no other router to fail over to. Under a steady load of greedy streams, one node at a time is
//  - killed with SIGKILL and started again with the same flags, as `k3serve local` restarts it;
//  - stopped with SIGSTOP past the coordinator's DEAD verdict and continued with SIGCONT;
//  - (router, attention worker) stopped with SIGTERM and started again once it exited; the
//    coordinator killed and restarted.
// The attention worker keeps the sequences' state and sends each MoE layer step again until the
// router (and its expert worker) can serve it (attention_nodes/moe_client/remote_routed_moe.h), so every
// request completes with the single-process engine's tokens, and requests sent right after the
// node is back do not fail either. The attention worker killed under streams sent through the
// HTTP front's gRPC port: the front resumes each stream on the restarted worker as prompt + tokens
// sent (http_front/worker_pool.h, GenerateCall), so the client's stream goes on with the same
// tokens, and requests that arrive while no worker is up wait for it.
//
// Printed per fault: requests completed and failed, the longest wait for a token.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "tests/cluster_testing.h"
#include "tests/greedy_load.h"

namespace k3 {
namespace {

constexpr int kClients = 4;
constexpr int kMaxNewTokens = 16;
constexpr absl::Duration kRequestTimeout = absl::Seconds(60);
// How long `k3serve local` waits before its first restart of a process (restart_supervisor.h).
constexpr absl::Duration kRestartDelay = absl::Milliseconds(200);
// Past the coordinator's DEAD verdict (heartbeat timeout 1.5 s), shorter than the issue's 10 s to
// keep the suite's time.
constexpr absl::Duration kStopped = absl::Seconds(4);

class ClusterRecoveryTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 5));
    prompts_ = new std::vector<std::vector<int32_t>>(
        TestPrompts(2 * kClients, NamedConfig("k3-tiny")->vocab_size, 13));
    absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
        SingleProcessTokens(*model_, *prompts_, kMaxNewTokens);
    if (!expected.ok()) {
      start_error_ = new std::string(expected.status().ToString());
      return;
    }
    expected_ = new std::vector<std::vector<int32_t>>(*std::move(expected));
    LocalClusterOptions options = TestClusterOptions(*model_, 1, 1, 1);
    options.http_port = 0;  // the front, as `k3serve local` starts it
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
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
    const absl::Status ready = cluster_->WaitReady(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(ready.ok()) << ready;
  }

  // Streams sent to the attention worker's gRPC port, or with `front` to the HTTP front's.
  std::unique_ptr<GreedyLoad> StartLoad(bool front = false) {
    return std::make_unique<GreedyLoad>(
        front ? cluster_->front_grpc_address() : cluster_->generate_addresses()[0], *prompts_,
        *expected_, kClients, kMaxNewTokens, kRequestTimeout);
  }

  // Lines of `node`'s log that contain one of `texts`.
  static int LogLines(const std::string& node, const std::vector<std::string>& texts) {
    absl::StatusOr<const LocalCluster::Node*> n = cluster_->node(node);
    if (!n.ok()) return 0;
    std::ifstream in((*n)->log_path);
    int count = 0;
    for (std::string line; std::getline(in, line);) {
      count += std::any_of(texts.begin(), texts.end(),
                           [&](const std::string& text) { return absl::StrContains(line, text); });
    }
    return count;
  }

  // Kills `node` under load, starts it again as `k3serve local` would, and expects every request
  // to complete with the fault-free tokens, and the fault to have reached streams in flight (a
  // line with one of `evidence` added to `witness`'s log).
  // With `signal` SIGTERM instead: `node` stops gracefully (it may take its drain's time) and
  // is started again once it exited; no evidence is asked for.
  void KillAndRestart(const std::string& node, const std::string& witness,
                      const std::vector<std::string>& evidence, bool front = false,
                      int signal = SIGKILL) {
    const int before = LogLines(witness, evidence);
    std::unique_ptr<GreedyLoad> load = StartLoad(front);
    ASSERT_TRUE(load->WaitMore(kClients, absl::Seconds(60)))
        << absl::StrJoin(load->failures(), "\n");
    load->ResetLongestGap();
    ASSERT_TRUE(cluster_->Signal(node, signal).ok());
    absl::StatusOr<int> exit = cluster_->WaitExit(node, absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    absl::SleepFor(kRestartDelay);
    ASSERT_TRUE(cluster_->Restart(node).ok());
    const absl::Time restarted = absl::Now();
    const absl::Status ready = cluster_->WaitReady(absl::Now() + absl::Seconds(40));
    EXPECT_TRUE(ready.ok()) << ready;
    std::cerr << node << " is back and the cluster ready "
              << absl::FormatDuration(absl::Now() - restarted) << " after its restart"
              << std::endl;
    EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(60)))
        << absl::StrJoin(load->failures(), "\n");
    load->Stop();
    Report(*load, node + (signal == SIGKILL ? " killed" : " stopped with SIGTERM") +
                      " and restarted");
    if (evidence.empty()) return;
    EXPECT_GT(LogLines(witness, evidence), before)
        << "no \"" << absl::StrJoin(evidence, "\" or \"") << "\" in the log of " << witness
        << ": did the fault reach a stream? Its end:\n"
        << LocalCluster::LogTail((*cluster_->node(witness))->log_path, 40);
  }

  // Stops `node` under load past the coordinator's DEAD verdict, continues it, and expects every
  // request, those sent right after it continued included, to complete with the fault-free tokens.
  void StopAndContinue(const std::string& node) {
    std::unique_ptr<GreedyLoad> load = StartLoad();
    ASSERT_TRUE(load->WaitMore(kClients, absl::Seconds(60)))
        << absl::StrJoin(load->failures(), "\n");
    load->ResetLongestGap();
    ASSERT_TRUE(cluster_->Signal(node, SIGSTOP).ok());
    absl::SleepFor(kStopped);
    ASSERT_TRUE(cluster_->Signal(node, SIGCONT).ok());
    EXPECT_TRUE(load->WaitMore(2 * kClients, absl::Seconds(60)))
        << absl::StrJoin(load->failures(), "\n");
    load->Stop();
    Report(*load, node + " stopped for " + absl::FormatDuration(kStopped));
    // The streams waited for it (nothing else could serve them).
    EXPECT_GE(load->longest_gap(), kStopped - absl::Milliseconds(500));
  }

  static void Report(const GreedyLoad& load, const std::string& fault) {
    std::cerr << fault << ": " << load.completed() << " requests completed, " << load.failed()
              << " failed; longest wait for a token: " << absl::FormatDuration(load.longest_gap())
              << std::endl;
    EXPECT_EQ(load.failed(), 0) << absl::StrJoin(load.failures(), "\n");
    const absl::Status running = cluster_->CheckRunning();
    EXPECT_TRUE(running.ok()) << running;
  }

  static std::string* model_;
  static std::string* start_error_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<std::vector<int32_t>>* expected_;
  static LocalCluster* cluster_;
};

std::string* ClusterRecoveryTest::model_ = nullptr;
std::string* ClusterRecoveryTest::start_error_ = nullptr;
std::vector<std::vector<int32_t>>* ClusterRecoveryTest::prompts_ = nullptr;
std::vector<std::vector<int32_t>>* ClusterRecoveryTest::expected_ = nullptr;
LocalCluster* ClusterRecoveryTest::cluster_ = nullptr;

TEST_F(ClusterRecoveryTest, AKilledExpertWorkerCostsNoRequest) {
  KillAndRestart("expert-0", "attention-0", {"cannot serve MoE layer"});
}

TEST_F(ClusterRecoveryTest, AKilledRouterCostsNoRequest) {
  KillAndRestart("router-0", "attention-0", {"failed during MoE layer"});
}

TEST_F(ClusterRecoveryTest, AStoppedRouterCostsNoRequest) { StopAndContinue("router-0"); }

TEST_F(ClusterRecoveryTest, AStoppedExpertWorkerCostsNoRequest) { StopAndContinue("expert-0"); }

TEST_F(ClusterRecoveryTest, ARouterStoppedWithSigtermCostsNoRequest) {
  KillAndRestart("router-0", "", {}, /*front=*/false, SIGTERM);
}

// The attention worker drains (its streams finish) and exits; requests that arrive meanwhile
// wait in the front for the restarted one.
TEST_F(ClusterRecoveryTest, AnAttentionWorkerStoppedWithSigtermCostsNoRequestThroughTheFront) {
  KillAndRestart("attention-0", "", {}, /*front=*/true, SIGTERM);
}

// The data plane serves without its coordinator, which relearns the cluster when it is back.
TEST_F(ClusterRecoveryTest, AKilledCoordinatorCostsNoRequest) {
  KillAndRestart("coordinator", "", {});
}

// The texts and finish reason of a streamed completion's events (server-sent events of
// /v1/completions), in order; "" when the stream did not end with [DONE].
std::string StreamedText(const std::string& events) {
  if (!absl::StrContains(events, "data: [DONE]")) return "";
  static const std::regex kField(R"re("(text|finish_reason)":("(?:[^"\\]|\\.)*"|null))re");
  std::string out;
  for (auto it = std::sregex_iterator(events.begin(), events.end(), kField);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[2] != "null") out += (*it)[0].str() + "\n";
  }
  return out;
}

// Streams of the OpenAI API (greedy completions of text prompts, with curl) one after the other
// on `threads` threads until Stop; each compared with the fault-free stream of its prompt.
class HttpLoad {
 public:
  HttpLoad(std::string address, int threads) : address_(std::move(address)) {
    for (int p = 0; p < kPrompts; ++p) expected_.push_back(StreamedText(Complete(p)));
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, t] {
        for (int n = t; !stop_; n += 2) {
          const std::string got = StreamedText(Complete(n % kPrompts));
          if (got == expected_[n % kPrompts]) {
            ++completed_;
          } else {
            std::cerr << "HTTP stream " << n << " differs: " << got << std::endl;
            ++failed_;
          }
        }
      });
    }
  }
  ~HttpLoad() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  bool baseline_ok() const {
    return std::all_of(expected_.begin(), expected_.end(),
                       [](const std::string& e) { return absl::StrContains(e, "finish_reason"); });
  }
  int completed() const { return completed_; }
  int failed() const { return failed_; }

 private:
  static constexpr int kPrompts = 3;
  std::string Complete(int prompt) const {
    return CommandOutput(absl::StrCat(
        "curl -sS -N --max-time 60 -H 'Content-Type: application/json' --data-binary "
        "'{\"prompt\":\"Once upon a time ",
        prompt, "\",\"max_tokens\":16,\"temperature\":0,\"stream\":true}' http://", address_,
        "/v1/completions"));
  }
  const std::string address_;
  std::vector<std::string> expected_;
  std::atomic<bool> stop_{false};
  std::atomic<int> completed_{0};
  std::atomic<int> failed_{0};
  std::vector<std::thread> threads_;
};

TEST_F(ClusterRecoveryTest, AKilledAttentionWorkerCostsNoRequestThroughTheFront) {
  HttpLoad http(cluster_->http_address(), 2);
  ASSERT_TRUE(http.baseline_ok()) << "the fault-free HTTP streams did not complete";
  // A stream cut mid-way is resumed; one cut before its first token is started again.
  KillAndRestart("attention-0", "http-0", {"resumed on attention worker", "after waiting"},
                 /*front=*/true);
  http.Stop();
  std::cerr << "OpenAI API streams meanwhile: " << http.completed() << " completed, "
            << http.failed() << " failed or differing" << std::endl;
  EXPECT_GT(http.completed(), 0);
  EXPECT_EQ(http.failed(), 0);
}

}  // namespace
}  // namespace k3
