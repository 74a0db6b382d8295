// Throughput and inter-token latency of one local cluster under concurrent streams (issue 24):
//
//   bazel run -c opt //bench:load_bench -- [--config k3-tiny] [--attention 1 --routers 1
//       --experts 2] [--prompt-tokens 200] [--max-tokens 64] [--streams 16] [--rounds 3]
//       [--requests-per-stream 3] [--load-requests 1000] [--load-concurrency 32]
//       [--busy-poll-us N] [--node-threads N] [--attention-arg=--FLAG=VALUE ...]
//
// Writes a random checkpoint, starts `k3serve local`'s processes (LocalCluster) and talks gRPC to
// the attention worker. Every request has its own random `--prompt-tokens` prompt and asks for
// exactly `--max-tokens` greedy tokens (ignore_eos). Part 1, in `--rounds` interleaved rounds:
// one stream, then `--streams` concurrent streams, each a closed loop of `--requests-per-stream`
// requests; it prints each round's tokens/s (all tokens over the round's wall time) and the p99
// of the gaps between a request's consecutive tokens as the client receives them, then the
// medians and ranges of the ratios many/one (goals: tokens/s >= 4x, p99 gap <= 3x), and for the
// last round where each side's steps spent their time (bench/step_breakdown.h). Part 2:
// `--load-requests` requests at `--load-concurrency` in flight; every one must end with all its
// tokens. Exits 1 when a request fails.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention_nodes/server/generate_client.h"
#include "base/status_macros.h"
#include "bench/cluster_bench_setup.h"
#include "bench/step_breakdown.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "proto/generate.pb.h"

namespace k3 {
namespace {

struct BenchOptions {
  std::string config = "k3-tiny";
  ClusterBenchFlags cluster;
  int prompt_tokens = 200;
  int max_tokens = 64;
  int streams = 16;
  int rounds = 3;
  int requests_per_stream = 3;
  int load_requests = 1000;
  int load_concurrency = 32;
  std::vector<std::string> attention_args;  // extra flags of the attention nodes
};

// What a set of requests measured.
struct Measured {
  int64_t tokens = 0;
  int failures = 0;
  std::string first_failure;
  std::vector<double> gaps;  // seconds between consecutive tokens of one request
};

class LoadRunner {
 public:
  LoadRunner(const BenchOptions& o, std::string address, int64_t vocab)
      : o_(o), address_(std::move(address)), vocab_(vocab) {}

  // Runs `requests` requests with `concurrency` in flight; returns what they measured.
  Measured Run(int requests, int concurrency) {
    Measured measured;
    absl::Mutex mu;
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < concurrency; ++t) {
      threads.emplace_back([&] {
        for (int i = next++; i < requests; i = next++) {
          Measured one = RunOne();
          absl::MutexLock lock(&mu);
          measured.tokens += one.tokens;
          measured.failures += one.failures;
          if (measured.first_failure.empty()) measured.first_failure = one.first_failure;
          measured.gaps.insert(measured.gaps.end(), one.gaps.begin(), one.gaps.end());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return measured;
  }

 private:
  Measured RunOne() {
    k3serve::v1::GenerateRequest request;
    {
      absl::MutexLock lock(&mu_);
      std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(vocab_ - 1));
      for (int i = 0; i < o_.prompt_tokens; ++i) request.add_prompt_token_ids(token(random_));
    }
    request.mutable_sampling()->set_temperature(0.0f);
    request.mutable_sampling()->set_max_new_tokens(o_.max_tokens);
    request.mutable_sampling()->set_ignore_eos(true);
    Measured measured;
    absl::Time last = absl::InfinitePast();
    auto on_tokens = [&](absl::Span<const int32_t> tokens) {
      const absl::Time now = absl::Now();
      if (last != absl::InfinitePast()) measured.gaps.push_back(absl::ToDoubleSeconds(now - last));
      // Tokens arriving together: the later ones came with no gap of their own.
      for (size_t i = 1; i < tokens.size(); ++i) measured.gaps.push_back(0);
      last = now;
    };
    absl::StatusOr<GenerateOutcome> outcome =
        GenerateOverGrpc(address_, request, absl::Minutes(10), on_tokens);
    if (!outcome.ok() || static_cast<int>(outcome->tokens.size()) != o_.max_tokens) {
      measured.failures = 1;
      measured.first_failure =
          outcome.ok() ? absl::StrCat("got ", outcome->tokens.size(), " tokens: ",
                                      outcome->complete.message())
                       : outcome.status().ToString();
      return measured;
    }
    measured.tokens = static_cast<int64_t>(outcome->tokens.size());
    return measured;
  }

  const BenchOptions& o_;
  const std::string address_;
  const int64_t vocab_;
  absl::Mutex mu_;
  std::mt19937 random_ ABSL_GUARDED_BY(mu_){20261204};
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

void PrintRatios(const char* what, std::vector<double> ratios, const char* goal) {
  std::sort(ratios.begin(), ratios.end());
  std::printf("%s: median %.2fx (range %.2f-%.2f over %zu rounds; goal %s)\n", what,
              Percentile(ratios, 0.5), ratios.front(), ratios.back(), ratios.size(), goal);
}

absl::Status Bench(const BenchOptions& o) {
  K3_ASSIGN_OR_RETURN(ModelConfig config, NamedConfig(o.config));
  const std::string dir = absl::StrCat(o.cluster.work_dir, "/", o.config);
  K3_RETURN_IF_ERROR(WriteRandomCheckpoint(config, 1, dir));
  K3_ASSIGN_OR_RETURN(
      std::unique_ptr<LocalCluster> cluster,
      LocalCluster::Start(ClusterBenchOptions(
          o.cluster, dir, absl::StrCat(o.cluster.work_dir, "/logs"), o.attention_args)));
  LoadRunner runner(o, cluster->generate_addresses()[0], config.vocab_size);
  runner.Run(2, 1);  // warm-up: page in weights, connect, fit the step cost
  std::vector<double> speedups, latency_ratios;
  StepBreakdown breakdown[2];
  for (int round = 0; round < o.rounds; ++round) {
    double rate[2], p99[2];
    for (int side = 0; side < 2; ++side) {
      const int streams = side == 0 ? 1 : o.streams;
      const StepBreakdown before = ScrapeStepBreakdown(*cluster);
      const absl::Time start = absl::Now();
      const Measured m = runner.Run(streams * o.requests_per_stream, streams);
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      breakdown[side] = Minus(ScrapeStepBreakdown(*cluster), before);
      if (m.failures > 0) return absl::InternalError(m.first_failure);
      rate[side] = m.tokens / seconds;
      p99[side] = Percentile(m.gaps, 0.99);
      std::printf("round %d, %2d stream(s): %7.1f tokens/s, inter-token p50 %.1f ms p99 %.1f ms\n",
                  round, streams, rate[side], 1e3 * Percentile(m.gaps, 0.5), 1e3 * p99[side]);
      std::fflush(stdout);
    }
    speedups.push_back(rate[1] / rate[0]);
    latency_ratios.push_back(p99[1] / p99[0]);
  }
  PrintStepBreakdown("1 stream", breakdown[0]);
  PrintStepBreakdown(absl::StrCat(o.streams, " streams"), breakdown[1]);
  PrintRatios(absl::StrCat("tokens/s, ", o.streams, " streams / 1").c_str(), speedups, ">= 4x");
  PrintRatios(absl::StrCat("inter-token p99, ", o.streams, " streams / 1").c_str(),
              latency_ratios, "<= 3x");
  if (o.load_requests > 0) {
    const absl::Time start = absl::Now();
    const Measured m = runner.Run(o.load_requests, o.load_concurrency);
    std::printf("%d requests at concurrency %d: %d failed, %.1f tokens/s over %.0f s%s%s\n",
                o.load_requests, o.load_concurrency, m.failures,
                m.tokens / absl::ToDoubleSeconds(absl::Now() - start),
                absl::ToDoubleSeconds(absl::Now() - start), m.failures > 0 ? "; first: " : "",
                m.first_failure.c_str());
    if (m.failures > 0) return absl::InternalError("requests failed under load");
  }
  return (cluster)->Stop();
}

int Main(const std::vector<std::string>& args) {
  BenchOptions o;
  CLI::App app{"load_bench: tokens/s and inter-token latency under concurrent streams"};
  app.add_option("--config", o.config, "named config");
  AddClusterBenchFlags(&app, &o.cluster);
  AddBoundedInt(&app, "--prompt-tokens", &o.prompt_tokens, 1, 1 << 20, "tokens per prompt");
  AddBoundedInt(&app, "--max-tokens", &o.max_tokens, 1, 1 << 20, "new tokens per request");
  AddBoundedInt(&app, "--streams", &o.streams, 1, 1024, "concurrent streams (part 1)");
  AddBoundedInt(&app, "--rounds", &o.rounds, 1, 1000, "interleaved rounds (part 1)");
  AddBoundedInt(&app, "--requests-per-stream", &o.requests_per_stream, 1, 1000,
                "requests each stream runs per round (part 1)");
  AddBoundedInt(&app, "--load-requests", &o.load_requests, 0, 1 << 24, "requests (part 2)");
  AddBoundedInt(&app, "--load-concurrency", &o.load_concurrency, 1, 1024,
                "requests in flight (part 2)");
  app.add_option("--attention-arg", o.attention_args,
                 "a flag for the attention nodes, e.g. --attention-arg=--min-prefill-tokens=32 "
                 "(repeatable)");
  return RunClusterBench(&app, args, "k3-load-bench", &o.cluster, [&o] { return Bench(o); });
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  k3::TuneServingProcess();
  return k3::Main(std::vector<std::string>(argv + 1, argv + argc));
}
