// End-to-end decode speed of a local k3serve cluster against the single-process engine on the same
// checkpoint, in one run:
//
//   bazel run -c opt //bench:cluster_bench -- [--configs k3-tiny,k3-perf] [--tokens 48]
//       [--repeats 3] [--attention 1 --routers 1 --experts 2] [--streams 8] [--ping-pong auto|on|off]
//       [--busy-poll-us N]
//
// For each config it writes a random checkpoint, then measures greedy decode tokens/s of one
// stream: (N - 1) / (T(N) - T(1)), where T(n) is the best wall time of a request for n new tokens
// after the same prompt, so prefill and per-request overhead cancel out. The single-process side
// is the single-process engine (ProcessEngine); the cluster side is Generate over gRPC against `k3serve local`'s
// processes (LocalCluster). It prints both and their ratio, plus the cluster's aggregate tokens/s
// with --streams concurrent streams (the attention node batches them) against the same streams
// through the attention worker's batching scheduler over in-process experts. At the end of each config it
// scrapes every node's /metrics and prints where a step's time went over the whole run: the
// attention worker's compute and MoE wait per step and per MoE layer, the router's compute and
// expert wait (wire both ways plus expert compute) per layer step, and the expert workers'
// compute per request; wire = router expert wait - expert compute (roughly: one layer step may
// ask several expert workers at once).

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "bench/cluster_bench_setup.h"
#include "bench/step_breakdown.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "base/status_macros.h"
#include "cluster/process_tuning.h"
#include "engine/process_engine.h"
#include "engine/local_routed_moe.h"
#include "model/weights.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "proto/generate.pb.h"
#include "cluster/command_line.h"

namespace k3 {
namespace {

struct BenchOptions {
  std::vector<std::string> configs = {"k3-tiny", "k3-perf"};
  int tokens = 48;
  int repeats = 3;
  int streams = 8;
  std::string ping_pong = "auto";  // the attention node's --ping-pong
  ClusterBenchFlags cluster;
};

const std::vector<int32_t> kPrompt = {11, 7, 300, 42, 5, 99, 123, 8};

// Best wall time of `repeats` runs of `run(n)`.
template <typename Run>
absl::StatusOr<absl::Duration> Best(int repeats, int n, Run run) {
  absl::Duration best = absl::InfiniteDuration();
  for (int r = 0; r < repeats; ++r) {
    const absl::Time start = absl::Now();
    K3_RETURN_IF_ERROR(run(n));
    best = std::min(best, absl::Now() - start);
  }
  return best;
}

// (N - 1) / (T(N) - T(1)) in tokens per second.
template <typename Run>
absl::StatusOr<double> DecodeTokensPerSecond(const BenchOptions& o, Run run) {
  if (absl::Status s = run(2); !s.ok()) return s;  // warm-up: page in weights, connect
  K3_ASSIGN_OR_RETURN(absl::Duration one, Best(o.repeats, 1, run));
  K3_ASSIGN_OR_RETURN(absl::Duration many, Best(o.repeats, o.tokens, run));
  const double seconds = absl::ToDoubleSeconds(many - one);
  if (seconds <= 0) return absl::InternalError("decode took no measurable time; raise --tokens");
  return (o.tokens - 1) / seconds;
}

// Counts a request's tokens and signals its end.
class CountingSink : public GenerationSink {
 public:
  explicit CountingSink(absl::BlockingCounter* done) : done_(done) {}
  void OnToken(int32_t, int, int) override { tokens_.fetch_add(1); }
  void OnFinish(const GenerationResult&) override { done_->DecrementCount(); }
  int64_t tokens() const { return tokens_.load(); }

 private:
  absl::BlockingCounter* done_;
  std::atomic<int64_t> tokens_{0};
};

// The single-process engine's aggregate over `streams` concurrent streams: the attention worker's
// batching scheduler over the in-process routed experts (what one attention worker of the cluster
// runs, with the experts at home), all tokens over the best wall time, prefill included.
absl::StatusOr<double> SingleProcessAggregate(const BenchOptions& o, const std::string& dir) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                      LoadWeights(dir, WeightSelection::All()));
  LocalRoutedMoe moe(weights.get());
  GenerationScheduler scheduler(weights.get(), &moe, SchedulerOptions(), nullptr);
  double best = 0;
  for (int r = 0; r < o.repeats; ++r) {
    absl::BlockingCounter done(o.streams);
    std::vector<std::shared_ptr<CountingSink>> sinks;
    const absl::Time start = absl::Now();
    for (int s = 0; s < o.streams; ++s) {
      GenerationRequest request;
      request.prompt = kPrompt;
      request.max_new_tokens = o.tokens;
      sinks.push_back(std::make_shared<CountingSink>(&done));
      K3_ASSIGN_OR_RETURN(std::shared_ptr<RequestHandle> handle,
                          scheduler.Submit(std::move(request), sinks.back()));
    }
    done.Wait();
    int64_t tokens = 0;
    for (const auto& sink : sinks) tokens += sink->tokens();
    best = std::max(best, tokens / absl::ToDoubleSeconds(absl::Now() - start));
  }
  scheduler.WaitIdle(absl::InfiniteFuture());
  return best;
}

absl::Status BenchConfig(const BenchOptions& o, const std::string& name) {
  K3_ASSIGN_OR_RETURN(ModelConfig config, NamedConfig(name));
  const std::string dir = absl::StrCat(o.cluster.work_dir, "/", name);
  std::cerr << "writing a random " << name << " checkpoint to " << dir << "\n";
  K3_RETURN_IF_ERROR(WriteRandomCheckpoint(config, 1, dir));

  double single = 0;
  {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<ProcessEngine> engine,
                        ProcessEngine::Open(dir, ComputeDevice()));
    absl::StatusOr<double> rate = DecodeTokensPerSecond(o, [&](int n) -> absl::Status {
      GenerationRequest request;
      request.prompt = kPrompt;
      request.max_new_tokens = n;
      return engine->Generate(request).status();
    });
    if (!rate.ok()) return rate.status();
    single = *rate;
  }  // frees the engine's memory before the cluster maps the checkpoint
  K3_ASSIGN_OR_RETURN(double single_streams, SingleProcessAggregate(o, dir));

  K3_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster,
                      LocalCluster::Start(ClusterBenchOptions(
                          o.cluster, dir, absl::StrCat(o.cluster.work_dir, "/logs-", name),
                          {"--ping-pong=" + o.ping_pong})));
  const std::string address = cluster->generate_addresses()[0];
  int request = 0;
  auto generate = [&](int n) -> absl::Status {
    K3_ASSIGN_OR_RETURN(
        GenerateOutcome outcome,
        GenerateOverGrpc(address, GreedyRequest(absl::StrCat("bench-", request++), kPrompt, n),
                         absl::Minutes(5)));
    if (static_cast<int>(outcome.tokens.size()) != n) {
      return absl::InternalError(absl::StrCat("asked for ", n, " tokens, got ",
                                              outcome.tokens.size(), ": ",
                                              outcome.complete.message()));
    }
    return absl::OkStatus();
  };
  K3_ASSIGN_OR_RETURN(double clustered, DecodeTokensPerSecond(o, generate));

  // Aggregate over concurrent streams: all tokens of all streams over the wall time.
  absl::Duration best = absl::InfiniteDuration();
  for (int r = 0; r < o.repeats; ++r) {
    std::vector<absl::Status> results(o.streams);
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int s = 0; s < o.streams; ++s) {
      threads.emplace_back([&, s] {
        absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
            address, GreedyRequest(absl::StrCat("bench-", r, "-", s), kPrompt, o.tokens),
            absl::Minutes(5));
        results[s] = outcome.status();
      });
    }
    for (std::thread& t : threads) t.join();
    best = std::min(best, absl::Now() - start);
    for (const absl::Status& s : results) {
      if (!s.ok()) return s;
    }
  }
  const double aggregate = o.streams * o.tokens / absl::ToDoubleSeconds(best);
  PrintStepBreakdown(name, ScrapeStepBreakdown(*cluster));
  if (absl::Status s = cluster->Stop(); !s.ok()) std::cerr << s.message() << "\n";

  std::cout << absl::StrFormat(
      "%-10s single-process %8.1f tok/s | cluster A=%d,R=%d,E=%d %8.1f tok/s | ratio %.3f | "
      "%d streams (incl. prefill): single-process %8.1f tok/s, cluster %8.1f tok/s, ratio "
      "%.3f\n",
      name, single, o.cluster.attention, o.cluster.routers, o.cluster.experts, clustered,
      clustered / single, o.streams, single_streams, aggregate, aggregate / single_streams);
  return absl::OkStatus();
}

int Main(const std::vector<std::string>& args) {
  BenchOptions o;
  std::string configs;
  CLI::App app{"cluster_bench: local cluster decode tokens/s against the single-process engine"};
  app.add_option("--configs", configs, "comma-separated named configs");
  AddBoundedInt(&app, "--tokens", &o.tokens, 2, 1 << 20, "new tokens per stream");
  AddBoundedInt(&app, "--repeats", &o.repeats, 1, 1000, "rounds (the best counts)");
  AddBoundedInt(&app, "--streams", &o.streams, 1, 1024, "concurrent streams");
  app.add_option("--ping-pong", o.ping_pong,
                 "the attention node's --ping-pong (two micro-batches per step: auto, on, off)");
  AddClusterBenchFlags(&app, &o.cluster);
  return RunClusterBench(&app, args, "k3-cluster-bench", &o.cluster, [&]() -> absl::Status {
    if (!configs.empty()) o.configs = absl::StrSplit(configs, ',');
    for (const std::string& config : o.configs) {
      if (absl::Status s = BenchConfig(o, config); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(config, ": ", s.message()));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  // The settings of k3serve's main, so that the in-process engine runs as `k3serve generate` does.
  k3::TuneServingProcess();
  return k3::Main(std::vector<std::string>(argv + 1, argv + argc));
}
