// Chaos under load (issues 10 and 24): `k3serve local`'s default expert tier (A1/R2/E3 of k3-tiny
// over UCX, no hand-set slots: the launcher's default spare slots give every expert a replica),
// supervised as `k3serve local` supervises it (a child that exits is restarted with backoff,
// launcher/restart_supervisor.h), serves 16 concurrent greedy streams for a bounded time while,
// one fault at a time, a random router, expert worker or the coordinator is sent SIGTERM (a
// graceful stop; an expert worker drains first), killed with SIGKILL or hung with SIGSTOP (and
// continued with SIGCONT). After each fault the test waits until the cluster recovered (every
// process runs, the coordinator is ready and every expert has two live hosts again) before the
// next. Faults and their timing come from a fixed seed.
//
// Printed: requests, failed, and requests whose tokens differ from the single-process engine's
// (the fault-free answer). Expected: 0 failed, 0 differing.
//
// K3_CHAOS_SECONDS (environment) sets how long faults are injected (default 60), K3_CHAOS_SEED
// the seed (default 1).
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "launcher/restart_supervisor.h"
#include "model/config.h"
#include "proto/cluster.pb.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr int kStreams = 16;
constexpr int kMaxNewTokens = 16;
constexpr absl::Duration kRequestTimeout = absl::Seconds(30);
constexpr absl::Duration kRecoveryTimeout = absl::Seconds(40);

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  int parsed = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &parsed) || parsed < 0) return fallback;
  return parsed;
}

// kStreams threads, each sending greedy requests one after the other until Stop; every outcome is
// compared with the single-process tokens.
class Load {
 public:
  Load(std::string address, std::vector<std::vector<int32_t>> prompts,
       std::vector<std::vector<int32_t>> expected)
      : address_(std::move(address)), prompts_(std::move(prompts)), expected_(std::move(expected)) {
    for (int c = 0; c < kStreams; ++c) threads_.emplace_back([this, c] { Run(c); });
  }
  ~Load() { Stop(); }

  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int requests() const { return requests_.load(); }
  int failed() const { return failed_.load(); }
  int differing() const { return differing_.load(); }
  std::vector<std::string> problems() const {
    absl::MutexLock lock(&mu_);
    return problems_;
  }

 private:
  void Run(int client) {
    for (int n = 0; !stop_; ++n) {
      const size_t p = (client + n * kStreams) % prompts_.size();
      const std::string id = absl::StrCat("chaos-", client, "-", n);
      absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
          address_, GreedyRequest(id, prompts_[p], kMaxNewTokens), kRequestTimeout);
      ++requests_;
      std::string problem;
      if (!outcome.ok()) {
        ++failed_;
        problem = absl::StrCat(absl::FormatTime(absl::Now()), " ", id,
                               " failed: ", outcome.status().ToString());
      } else if (outcome->tokens != expected_[p]) {
        ++differing_;
        problem = absl::StrCat(absl::FormatTime(absl::Now()), " ", id, " tokens ",
                               absl::StrJoin(outcome->tokens, ","), " differ from ",
                               absl::StrJoin(expected_[p], ","));
      }
      if (!problem.empty()) {
        std::cerr << problem << std::endl;
        absl::MutexLock lock(&mu_);
        problems_.push_back(problem);
      }
    }
  }

  const std::string address_;
  const std::vector<std::vector<int32_t>> prompts_;
  const std::vector<std::vector<int32_t>> expected_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::atomic<int> failed_{0};
  std::atomic<int> differing_{0};
  mutable absl::Mutex mu_;
  std::vector<std::string> problems_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Restarts the nodes that die, as `k3serve local` does. Owned by the thread that owns the cluster
// (the children die with the thread that started them).
class Supervision {
 public:
  explicit Supervision(LocalCluster* cluster) : cluster_(cluster), supervisor_(Policy()) {
    const absl::Time now = absl::Now();
    for (const LocalCluster::Node& node : cluster_->nodes()) supervisor_.Started(node.name, now);
  }

  // Reaps nodes that exited and restarts those whose backoff passed. False when a node is given
  // up on or cannot be restarted (recorded in error()).
  bool Tick() {
    const absl::Time now = absl::Now();
    for (const LocalCluster::Node* node : cluster_->Reap()) {
      const RestartSupervisor::Decision decision =
          supervisor_.Exited(node->name, node->exit_status, now);
      std::cerr << decision.message << std::endl;
      if (decision.give_up) error_ = decision.message;
      ++pending_;
    }
    for (const std::string& name : supervisor_.TakeDue(now)) {
      if (absl::Status s = cluster_->Restart(name); !s.ok()) {
        error_ = absl::StrCat("restarting ", name, ": ", s.ToString());
        continue;
      }
      supervisor_.Started(name, absl::Now());
      --pending_;
      ++restarts_;
    }
    return error_.empty();
  }
  // Every node that died was restarted.
  bool settled() const { return pending_ == 0; }
  int restarts() const { return restarts_; }
  const std::string& error() const { return error_; }

 private:
  static RestartPolicy Policy() {
    RestartPolicy policy;
    policy.initial_backoff = absl::Milliseconds(200);
    policy.max_backoff = absl::Seconds(2);
    return policy;
  }

  LocalCluster* const cluster_;
  RestartSupervisor supervisor_;
  int pending_ = 0;
  int restarts_ = 0;
  std::string error_;
};

// Why the cluster is not recovered: empty when the coordinator is ready, relearned everything,
// knows every running process as an ALIVE member and every expert of every MoE layer has at least
// two ALIVE hosts.
std::string NotRecovered(const LocalCluster& cluster) {
  absl::StatusOr<pb::ClusterState> state = cluster.GetClusterState(absl::Seconds(1));
  if (!state.ok()) return state.status().ToString();
  if (!state->ready()) return absl::StrCat("not ready: ", state->not_ready_reason());
  if (state->recovering()) return "the coordinator is relearning the cluster";
  std::set<pid_t> running;
  for (const LocalCluster::Node& node : cluster.nodes()) {
    if (node.role == NodeRole::kCoordinator) continue;
    if (node.pid <= 0) return absl::StrCat(node.name, " is not running");
    running.insert(node.pid);
  }
  // ALIVE members that are running processes (a killed one may still look ALIVE until its
  // heartbeats time out).
  std::map<uint32_t, bool> members;
  std::set<pid_t> alive;
  for (const pb::Member& m : state->members()) {
    const pid_t pid = static_cast<pid_t>(m.node().pid());
    const bool live = m.state() == pb::ALIVE && running.count(pid) > 0;
    members[m.node().node_id()] = live;
    if (live) alive.insert(pid);
  }
  for (const LocalCluster::Node& node : cluster.nodes()) {
    if (node.role != NodeRole::kCoordinator && alive.count(node.pid) == 0) {
      return absl::StrCat(node.name, " is not an ALIVE member");
    }
  }
  const pb::ExpertPlacement& placement = state->placement();
  for (int l = 0; l < placement.layers_size(); ++l) {
    for (int e = 0; e < placement.layers(l).experts_size(); ++e) {
      int alive = 0;
      for (int w : placement.layers(l).experts(e).workers()) {
        if (w < placement.worker_node_ids_size() && members[placement.worker_node_ids(w)]) {
          ++alive;
        }
      }
      if (alive < 2) return absl::StrCat("expert ", e, " of MoE layer ", l, " has ", alive,
                                         " live hosts");
    }
  }
  return "";
}

TEST(ClusterChaosTest, NoRequestIsLostToFaultsOneAtATime) {
  const int seconds = EnvInt("K3_CHAOS_SECONDS", 60);
  const int seed = EnvInt("K3_CHAOS_SEED", 1);
  const std::string model = RandomCheckpointDir("k3-tiny", 5);
  const std::vector<std::vector<int32_t>> prompts =
      TestPrompts(kStreams, NamedConfig("k3-tiny")->vocab_size, 17);
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, prompts, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();

  // 32 experts over 3 workers of 11 slots, and (the launcher's default) 11 spare slots each: ring
  // replicas give every expert a second host.
  LocalClusterOptions options = TestClusterOptions(model, 1, 2, 3);
  options.spare_expert_slots = LocalClusterOptions().spare_expert_slots;
  // Two MoE layers in flight per step: the retries and failovers then run for both at once.
  options.extra_args[NodeRole::kAttention] = {"--ping-pong=on"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LocalCluster> cluster = *std::move(started);
  ASSERT_EQ(NotRecovered(*cluster), "");

  Supervision supervision(cluster.get());
  std::vector<std::string> targets = {"coordinator"};
  for (const LocalCluster::Node& node : cluster->nodes()) {
    if (node.role == NodeRole::kRouter || node.role == NodeRole::kExpert) {
      targets.push_back(node.name);
    }
  }
  std::mt19937 random(static_cast<uint32_t>(seed));
  // Supervises for `duration`: the deliberate pacing of the faults.
  auto supervise_for = [&](absl::Duration duration) {
    const absl::Time until = absl::Now() + duration;
    while (absl::Now() < until && supervision.Tick()) absl::SleepFor(absl::Milliseconds(20));
  };

  Load load(cluster->generate_addresses()[0], prompts, *expected);
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  int faults = 0;
  std::vector<std::string> log;
  while (absl::Now() < end && supervision.error().empty()) {
    supervise_for(absl::Milliseconds(std::uniform_int_distribution<int>(1500, 3000)(random)));
    const std::string target =
        targets[std::uniform_int_distribution<size_t>(0, targets.size() - 1)(random)];
    const int kind = std::uniform_int_distribution<int>(0, 2)(random);
    const bool kill = kind != 1;  // SIGKILL or SIGTERM: the process goes and is restarted
    const int stop_signal = kind == 0 ? SIGKILL : SIGTERM;
    const absl::Duration hang =
        absl::Milliseconds(std::uniform_int_distribution<int>(500, 3000)(random));
    const absl::Time at = absl::Now();
    const pid_t pid = (*cluster->node(target))->pid;
    if (kill) {
      ASSERT_TRUE(cluster->Signal(target, stop_signal).ok()) << target;
    } else {
      ASSERT_TRUE(cluster->Signal(target, SIGSTOP).ok()) << target;
      supervise_for(hang);
      ASSERT_TRUE(cluster->Signal(target, SIGCONT).ok()) << target;
    }
    ++faults;
    // Recovered: every node runs again and every expert has two live hosts.
    std::string why;
    absl::Time next_check = absl::InfinitePast();
    const bool recovered = WaitFor(
        [&] {
          if (!supervision.Tick()) return true;
          // A killed node is back only once the supervisor restarted it.
          if (kill && (*cluster->node(target))->pid == pid) return false;
          if (!supervision.settled() || absl::Now() < next_check) return false;
          next_check = absl::Now() + absl::Milliseconds(100);
          why = NotRecovered(*cluster);
          return why.empty();
        },
        kRecoveryTimeout);
    const std::string fault = kill ? (stop_signal == SIGKILL ? "SIGKILL" : "SIGTERM")
                                   : absl::StrCat("SIGSTOP for ", absl::FormatDuration(hang));
    const std::string line = absl::StrCat(
        "fault ", faults, " at ", absl::FormatDuration(at - start), ": ", fault, " ", target,
        "; recovered after ", absl::FormatDuration(absl::Now() - at), "; ",
        load.requests(), " requests, ", load.failed(), " failed, ", load.differing(),
        " differing so far");
    std::cerr << line << std::endl;
    log.push_back(line);
    ASSERT_TRUE(supervision.error().empty()) << supervision.error();
    ASSERT_TRUE(recovered) << "not recovered from fault " << faults << " after "
                           << absl::FormatDuration(kRecoveryTimeout) << ": " << why;
  }
  // A last stretch without faults: the recovered cluster serves.
  const int before = load.requests();
  EXPECT_TRUE(WaitFor([&] { return load.requests() >= before + kStreams; }, absl::Seconds(60)));
  load.Stop();

  std::cerr << "chaos: " << faults << " faults (" << supervision.restarts() << " restarts) in "
            << absl::FormatDuration(absl::Now() - start) << ", seed " << seed << ": "
            << load.requests() << " requests, " << load.failed() << " failed, "
            << load.differing() << " differing from the fault-free run" << std::endl;
  EXPECT_GT(faults, 0);
  EXPECT_EQ(load.failed(), 0) << absl::StrJoin(load.problems(), "\n");
  EXPECT_EQ(load.differing(), 0) << absl::StrJoin(load.problems(), "\n");
  const absl::Status stopped = cluster->Stop();
  if (!stopped.ok()) std::cerr << "stopping the cluster: " << stopped << std::endl;
}

}  // namespace
}  // namespace k3
