// prefix_cache_bench: time to first token of a conversation's second turn with the prefix cache,
// against its first turn, on a random k3-tiny checkpoint (issue 24: ">= 10x sooner").
//
//   bazel run //bench:prefix_cache_bench -- [--prompt-tokens 8192] [--added-tokens 64]
//                                                   [--answer-tokens 16] [--rounds 5]
//
// The turns run through a GenerationScheduler over the in-process routed experts (the one
// generation loop: the attention worker's, `k3serve serve`'s and the CLI's).
//
// Each round is a new conversation (random tokens, so nothing is shared across rounds): turn 1 is
// the prompt, answered with --answer-tokens tokens; turn 2 is turn 1, its answer and
// --added-tokens new tokens. Both turns run on the same engine with the prefix cache, and turn 2
// also on an engine without it (what turn 2 costs cold). Reported: the per-round ratios, median
// and range over the rounds (rounds interleave the three measurements, so a noisy host moves all
// of them alike).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/synchronization/notification.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "engine/local_routed_moe.h"
#include "model/weights.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

namespace k3::bench {
namespace {

struct Options {
  int prompt_tokens = 8192;
  int added_tokens = 64;
  int answer_tokens = 16;
  int rounds = 5;
};

// Parses the command line into `options`; the exit status when the bench should not run.
std::optional<int> ParseOptions(int argc, char** argv, Options* options) {
  constexpr int kMost = std::numeric_limits<int>::max();
  CLI::App app{"prefix_cache_bench: a second turn's first token with the prefix cache"};
  AddBoundedInt(&app, "--prompt-tokens", &options->prompt_tokens, 1, kMost, "turn 1's prompt");
  AddBoundedInt(&app, "--added-tokens", &options->added_tokens, 0, kMost,
                "new tokens of turn 2 after turn 1 and its answer");
  AddBoundedInt(&app, "--answer-tokens", &options->answer_tokens, 0, kMost,
                "tokens of turn 1's answer");
  AddBoundedInt(&app, "--rounds", &options->rounds, 1, kMost, "conversations timed");
  return ParseToolArgs(&app, {argv + 1, argv + argc});
}

struct Timed {
  double first_token_seconds = 0;
  std::vector<int32_t> answer;
};

// The first token's time and the tokens of one request through a scheduler.
class TimingSink : public GenerationSink {
 public:
  explicit TimingSink(absl::Time start) : start_(start) {}
  void OnToken(int32_t token, int, int) override {
    if (timed_.answer.empty()) {
      timed_.first_token_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    }
    timed_.answer.push_back(token);
  }
  void OnFinish(const GenerationResult& result) override {
    status_ = result.status;
    done_.Notify();
  }
  Timed Wait() {
    done_.WaitForNotification();
    if (!status_.ok()) {
      std::fprintf(stderr, "generate: %s\n", status_.ToString().c_str());
      std::exit(1);
    }
    return timed_;
  }

 private:
  const absl::Time start_;
  Timed timed_;
  absl::Status status_;
  absl::Notification done_;
};

Timed TimeScheduled(GenerationScheduler& scheduler, const std::vector<int32_t>& prompt,
                    int answer_tokens) {
  GenerationRequest request;
  request.prompt = prompt;
  request.max_new_tokens = answer_tokens;
  request.ignore_eos = true;
  auto sink = std::make_shared<TimingSink>(absl::Now());
  if (!scheduler.Submit(std::move(request), sink).ok()) std::exit(1);
  return sink->Wait();
}

// One attention worker's scheduler over its own in-process routed experts.
struct ScheduledWorker {
  ScheduledWorker(const ModelWeights* weights, int64_t prefix_cache_bytes)
      : moe(weights), scheduler(weights, &moe, Options(prefix_cache_bytes), nullptr) {}
  static SchedulerOptions Options(int64_t prefix_cache_bytes) {
    SchedulerOptions options;
    options.prefix_cache_bytes = prefix_cache_bytes;
    return options;
  }
  LocalRoutedMoe moe;
  GenerationScheduler scheduler;
};

using TurnRunner = std::function<Timed(const std::vector<int32_t>&, int)>;

void Report(const char* what, std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::printf("%-44s median %8.4f  range %8.4f .. %8.4f\n", what, values[values.size() / 2],
              values.front(), values.back());
}

int Main(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_status = ParseOptions(argc, argv, &options)) return *exit_status;
  TuneServingProcess();
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/k3_prefix_cache_bench";
  std::filesystem::create_directories(dir);
  if (absl::Status s = WriteRandomCheckpoint(*config, 3, dir, 1); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(dir, WeightSelection::All());
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  ScheduledWorker cached_worker(weights->get(), SchedulerOptions().prefix_cache_bytes);
  ScheduledWorker plain_worker(weights->get(), 0);
  TurnRunner with_cache = [&](const std::vector<int32_t>& prompt, int answer) {
    return TimeScheduled(cached_worker.scheduler, prompt, answer);
  };
  TurnRunner without_cache = [&](const std::vector<int32_t>& prompt, int answer) {
    return TimeScheduled(plain_worker.scheduler, prompt, answer);
  };
  std::mt19937 rng(11);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % config->vocab_size);
    return t;
  };
  std::vector<double> first, second, cold, ratio, cold_ratio;
  for (int round = 0; round < options.rounds; ++round) {
    std::vector<int32_t> prompt = random_tokens(options.prompt_tokens);
    const Timed turn1 = with_cache(prompt, options.answer_tokens);
    prompt.insert(prompt.end(), turn1.answer.begin(), turn1.answer.end());
    const std::vector<int32_t> added = random_tokens(options.added_tokens);
    prompt.insert(prompt.end(), added.begin(), added.end());
    const Timed turn2 = with_cache(prompt, 1);
    const Timed turn2_cold = without_cache(prompt, 1);
    first.push_back(turn1.first_token_seconds);
    second.push_back(turn2.first_token_seconds);
    cold.push_back(turn2_cold.first_token_seconds);
    ratio.push_back(turn1.first_token_seconds / turn2.first_token_seconds);
    cold_ratio.push_back(turn2_cold.first_token_seconds / turn2.first_token_seconds);
    std::printf("round %d: turn 1 %.4f s, turn 2 %.4f s (cold %.4f s): %.1fx\n", round,
                turn1.first_token_seconds, turn2.first_token_seconds,
                turn2_cold.first_token_seconds, ratio.back());
  }
  std::printf("k3-tiny, %d-token first turn, +%d answer +%d new tokens, %d rounds\n",
              options.prompt_tokens,
              options.answer_tokens, options.added_tokens, options.rounds);
  Report("turn 1 first token (s)", first);
  Report("turn 2 first token, prefix cache (s)", second);
  Report("turn 2 first token, no cache (s)", cold);
  Report("turn 1 / turn 2 with the cache (x)", ratio);
  Report("turn 2 no cache / with the cache (x)", cold_ratio);
  {
    const PrefixCacheStats stats = cached_worker.scheduler.prefix_cache_stats();
    std::printf("cache: %lld/%lld hits, %lld of %lld tokens restored, %lld bytes held\n",
                static_cast<long long>(stats.hits), static_cast<long long>(stats.lookups),
                static_cast<long long>(stats.hit_tokens),
                static_cast<long long>(stats.lookup_tokens), static_cast<long long>(stats.bytes));
  }
  return 0;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) { return k3::bench::Main(argc, argv); }
