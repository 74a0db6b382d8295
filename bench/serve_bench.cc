// `k3serve serve` under concurrent streams, against the single-process engine's decode (issue 36):
//
//   bazel run -c opt //bench:serve_bench -- [--config k3-perf] [--prompt-tokens 16]
//       [--max-tokens 48] [--streams 16] [--rounds 3] [--requests-per-stream 2]
//       [--http-requests 1000] [--http-concurrency 32] [--http-max-tokens 16]
//       [--serve-arg=--FLAG=VALUE ...] [--k3serve PATH] [--work-dir DIR]
//
// Writes a random model folder (checkpoint and tokenizer), starts `k3serve serve` on it and, in
// this process, the single-process engine (LocalEngine) on the same checkpoint. Every request
// has its own random prompt and asks for exactly --max-tokens greedy tokens (ignore_eos).
// Part 1, in --rounds interleaved rounds: the engine's decode alone (one prefill of a prompt of
// the same length, then --max-tokens single-token steps, timed as engine_bench times decode);
// one stream of requests over gRPC; --streams concurrent streams (each --requests-per-stream
// requests). It prints each round's tokens/s (all tokens over the wall time), the p99 of the
// gaps between a request's consecutive tokens as the client receives them, and one stream's
// decode rate (tokens after the first over the time from the first to the last), then the
// medians and ranges of the ratios: many/one tokens/s (goal >= 4x), many/one p99 gap
// (goal <= 3x), one stream's decode / the engine's (goal >= 0.95). Part 2: --http-requests
// completions through the OpenAI HTTP API with --http-concurrency in flight; every one must
// answer 200 with a finish reason. Exits 1 when a request fails.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention_nodes/server/generate_client.h"
#include "base/status_macros.h"
#include "bench/work_dir.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "engine/local_engine.h"
#include "httplib.h"
#include "model/config.h"
#include "proto/generate.pb.h"
#include "tests/serve_process.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

struct BenchOptions {
  std::string config = "k3-perf";
  int prompt_tokens = 16;
  int max_tokens = 48;
  int streams = 16;
  int rounds = 3;
  int requests_per_stream = 2;
  int http_requests = 1000;
  int http_concurrency = 32;
  int http_max_tokens = 16;
  std::vector<std::string> serve_args;
  std::string k3serve = "k3serve";
  std::string work_dir;
};

struct Measured {
  int64_t tokens = 0;
  int failures = 0;
  std::string first_failure;
  std::vector<double> gaps;          // seconds between consecutive tokens of one request
  std::vector<double> decode_rates;  // per request: tokens after the first / first to last
};

class Prompts {
 public:
  Prompts(int tokens, int64_t vocab) : tokens_(tokens), vocab_(vocab) {}
  std::vector<int32_t> Next() {
    absl::MutexLock lock(&mu_);
    std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(vocab_ - 1));
    std::vector<int32_t> prompt(tokens_);
    for (int32_t& t : prompt) t = token(random_);
    return prompt;
  }

 private:
  const int tokens_;
  const int64_t vocab_;
  absl::Mutex mu_;
  std::mt19937 random_ ABSL_GUARDED_BY(mu_){20261207};
};

// `requests` Generate calls over gRPC with `concurrency` in flight.
Measured RunGrpc(const BenchOptions& o, const std::string& address, Prompts& prompts,
                 int requests, int concurrency) {
  Measured total;
  absl::Mutex mu;
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < requests; i = next++) {
        k3serve::v1::GenerateRequest request;
        for (int32_t id : prompts.Next()) request.add_prompt_token_ids(id);
        request.mutable_sampling()->set_temperature(0.0f);
        request.mutable_sampling()->set_max_new_tokens(o.max_tokens);
        request.mutable_sampling()->set_ignore_eos(true);
        std::vector<double> gaps;
        absl::Time first = absl::InfinitePast(), last = absl::InfinitePast();
        auto on_tokens = [&](absl::Span<const int32_t> tokens) {
          const absl::Time now = absl::Now();
          if (last != absl::InfinitePast()) gaps.push_back(absl::ToDoubleSeconds(now - last));
          if (first == absl::InfinitePast()) first = now;
          // Tokens arriving together: the later ones came with no gap of their own.
          for (size_t k = 1; k < tokens.size(); ++k) gaps.push_back(0);
          last = now;
        };
        absl::StatusOr<GenerateOutcome> outcome =
            GenerateOverGrpc(address, request, absl::Minutes(10), on_tokens);
        absl::MutexLock lock(&mu);
        if (!outcome.ok() || static_cast<int>(outcome->tokens.size()) != o.max_tokens) {
          ++total.failures;
          if (total.first_failure.empty()) {
            total.first_failure = outcome.ok() ? absl::StrCat("got ", outcome->tokens.size(),
                                                              " tokens: ",
                                                              outcome->complete.message())
                                               : outcome.status().ToString();
          }
          continue;
        }
        total.tokens += o.max_tokens;
        total.gaps.insert(total.gaps.end(), gaps.begin(), gaps.end());
        if (last > first) {
          total.decode_rates.push_back((o.max_tokens - 1) / absl::ToDoubleSeconds(last - first));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return total;
}

// The engine's decode tokens/s after a prompt: --max-tokens single-token steps, greedy.
absl::StatusOr<double> EngineDecodeRate(LocalEngine& engine, const std::vector<int32_t>& prompt,
                                        int tokens) {
  ModelRunner& runner = engine.runner();
  std::unique_ptr<SequenceState> state = runner.NewSequence();
  std::vector<float> logits;
  BatchEntry entry{state.get(), absl::MakeConstSpan(prompt), false};
  K3_RETURN_IF_ERROR(runner.Step({entry}, &logits));
  int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
  const absl::Time start = absl::Now();
  for (int t = 1; t < tokens; ++t) {
    BatchEntry step{state.get(), absl::MakeConstSpan(&next, 1), false};
    K3_RETURN_IF_ERROR(runner.Step({step}, &logits));
    next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  return (tokens - 1) / absl::ToDoubleSeconds(absl::Now() - start);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

void PrintRatios(const std::string& what, std::vector<double> ratios, const char* goal) {
  std::sort(ratios.begin(), ratios.end());
  std::printf("%s: median %.2fx (range %.2f-%.2f over %zu rounds; goal %s)\n", what.c_str(),
              Percentile(ratios, 0.5), ratios.front(), ratios.back(), ratios.size(), goal);
}

// Part 2: completions through the OpenAI HTTP API; the count of failures (the first printed).
int RunHttp(const BenchOptions& o, const std::string& address, Prompts& prompts) {
  std::atomic<int> next{0}, failures{0};
  absl::Mutex mu;
  std::string first_failure;
  const std::vector<std::string> host_port = absl::StrSplit(address, ':');
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < o.http_concurrency; ++t) {
    threads.emplace_back([&] {
      httplib::Client client(host_port[0], std::stoi(host_port[1]));
      client.set_read_timeout(600, 0);
      for (int i = next++; i < o.http_requests; i = next++) {
        const nlohmann::json body = {{"prompt", prompts.Next()},
                                     {"max_tokens", o.http_max_tokens},
                                     {"temperature", 0}};
        httplib::Result result = client.Post("/v1/completions", body.dump(), "application/json");
        std::string error;
        if (!result) {
          error = httplib::to_string(result.error());
        } else if (result->status != 200) {
          error = absl::StrCat(result->status, ": ", result->body);
        } else {
          const nlohmann::json reply = nlohmann::json::parse(result->body, nullptr, false);
          if (!reply.contains("choices") || !reply["choices"][0]["finish_reason"].is_string()) {
            error = result->body;
          }
        }
        if (!error.empty()) {
          ++failures;
          absl::MutexLock lock(&mu);
          if (first_failure.empty()) first_failure = error;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("%d HTTP completions at concurrency %d (%d tokens each at most): %d failed in %.0f s%s%s\n",
              o.http_requests, o.http_concurrency, o.http_max_tokens, failures.load(),
              absl::ToDoubleSeconds(absl::Now() - start), failures > 0 ? "; first: " : "",
              first_failure.c_str());
  return failures.load();
}

absl::Status Bench(const BenchOptions& o) {
  K3_ASSIGN_OR_RETURN(ModelConfig config, NamedConfig(o.config));
  const std::string dir = absl::StrCat(o.work_dir, "/", o.config);
  std::printf("writing a random %s model folder to %s\n", o.config.c_str(), dir.c_str());
  K3_RETURN_IF_ERROR(WriteRandomModelFolder(config, 1, dir));
  K3_ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Open(dir));
  ServeProcess serve;
  K3_RETURN_IF_ERROR(serve.Start(o.k3serve, dir, o.serve_args));
  Prompts prompts(o.prompt_tokens, config.vocab_size);
  RunGrpc(o, serve.generate_address(), prompts, 2, 1);  // warm-up: page in, fit the step cost
  K3_RETURN_IF_ERROR(EngineDecodeRate(*engine, prompts.Next(), o.max_tokens).status());

  std::vector<double> speedups, latency_ratios, decode_ratios;
  for (int round = 0; round < o.rounds; ++round) {
    K3_ASSIGN_OR_RETURN(double engine_rate,
                        EngineDecodeRate(*engine, prompts.Next(), o.max_tokens));
    std::printf("round %d, engine decode: %7.1f tokens/s\n", round, engine_rate);
    double rate[2], p99[2];
    for (int side = 0; side < 2; ++side) {
      const int streams = side == 0 ? 1 : o.streams;
      const absl::Time start = absl::Now();
      const Measured m = RunGrpc(o, serve.generate_address(), prompts,
                                 streams * o.requests_per_stream, streams);
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (m.failures > 0) return absl::InternalError(m.first_failure);
      rate[side] = m.tokens / seconds;
      p99[side] = Percentile(m.gaps, 0.99);
      std::printf(
          "round %d, %2d stream(s): %7.1f tokens/s, inter-token p50 %.1f ms p99 %.1f ms, "
          "a stream's decode %.1f tokens/s (median)\n",
          round, streams, rate[side], 1e3 * Percentile(m.gaps, 0.5), 1e3 * p99[side],
          Percentile(m.decode_rates, 0.5));
      if (side == 0) decode_ratios.push_back(Percentile(m.decode_rates, 0.5) / engine_rate);
      std::fflush(stdout);
    }
    speedups.push_back(rate[1] / rate[0]);
    latency_ratios.push_back(p99[1] / p99[0]);
  }
  PrintRatios(absl::StrCat("tokens/s, ", o.streams, " streams / 1"), speedups, ">= 4x");
  PrintRatios(absl::StrCat("inter-token p99, ", o.streams, " streams / 1"), latency_ratios,
              "<= 3x");
  PrintRatios("one stream's decode / the engine's", decode_ratios, ">= 0.95x");
  if (o.http_requests > 0 && RunHttp(o, serve.http_address(), prompts) > 0) {
    return absl::InternalError("HTTP requests failed");
  }
  if (const int exit_status = serve.Stop(); exit_status != 0) {
    return absl::InternalError(absl::StrCat("k3serve serve exited with ", exit_status));
  }
  return absl::OkStatus();
}

int Main(const std::vector<std::string>& args) {
  BenchOptions o;
  CLI::App app{"serve_bench: `k3serve serve` under concurrent streams"};
  app.add_option("--config", o.config, "named config")->capture_default_str();
  AddBoundedInt(&app, "--prompt-tokens", &o.prompt_tokens, 1, 1 << 20, "tokens per prompt");
  AddBoundedInt(&app, "--max-tokens", &o.max_tokens, 2, 1 << 20, "new tokens per request");
  AddBoundedInt(&app, "--streams", &o.streams, 1, 1024, "concurrent streams (part 1)");
  AddBoundedInt(&app, "--rounds", &o.rounds, 1, 1000, "interleaved rounds (part 1)");
  AddBoundedInt(&app, "--requests-per-stream", &o.requests_per_stream, 1, 1000,
                "requests each stream runs per round (part 1)");
  AddBoundedInt(&app, "--http-requests", &o.http_requests, 0, 1 << 24,
                "completions through the HTTP API (part 2)");
  AddBoundedInt(&app, "--http-concurrency", &o.http_concurrency, 1, 1024,
                "completions in flight (part 2)");
  AddBoundedInt(&app, "--http-max-tokens", &o.http_max_tokens, 1, 1 << 20,
                "max_tokens of each completion (part 2)");
  app.add_option("--serve-arg", o.serve_args,
                 "a flag for `k3serve serve`, e.g. --serve-arg=--max-sequences=32 (repeatable)");
  app.add_option("--k3serve", o.k3serve, "the k3serve binary")->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "where the model folder goes (default: a new folder)");
  if (std::optional<int> exit_status = ParseToolArgs(&app, args)) return *exit_status;
  o.k3serve = std::filesystem::absolute(o.k3serve).string();
  const bool own_work_dir = o.work_dir.empty();
  if (own_work_dir) {
    absl::StatusOr<std::string> made = MakeBenchWorkDir("k3-serve-bench");
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    o.work_dir = *made;
  }
  if (absl::Status status = Bench(o); !status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  if (own_work_dir) std::filesystem::remove_all(o.work_dir);
  return 0;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  k3::TuneServingProcess();
  return k3::Main(std::vector<std::string>(argv + 1, argv + argc));
}
