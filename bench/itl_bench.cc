// Inter-token latency of running streams while a long prompt is admitted (issue 8, item 4).
//
// One attention worker's GenerationScheduler over the in-process routed experts (LocalRoutedMoe)
// on a random checkpoint: `--streams` streams decode, each a run of requests of
// `--stream-tokens` new tokens (a finished one is replaced at once, so the streams' contexts stay
// alike throughout, as in a server with a steady mix of requests); their inter-token gaps
// (within a request) are measured first
// alone ("without": `--window` tokens per stream), then from the moment a `--prompt-tokens`
// prompt is submitted until its first token ("with"). Both ways run twice in one process: with
// the prefill chunk fixed at the step budget (the scheduler before adaptive prefill) and with
// the adaptive prompt budget (StepBudget). Prints p50/p99 of the gaps and the p99 ratio
// with/without for each (goal: adaptive <= 3x), and checks that the long prompt's first token
// is the same either way.
//
//   bazel-bin/bench/itl_bench [--config k3-tiny] [--prompt-tokens 32000] [--streams 4]
//                             [--window 200] [--stream-tokens 128] [--max-batch-tokens 2048]
//                             [--target-factor X (default SchedulerOptions::step_target_factor, 2)]
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "base/status_macros.h"
#include "bench/random_weights.h"
#include "cluster/command_line.h"
#include "engine/local_routed_moe.h"
#include "model/weights.h"

namespace k3::bench {
namespace {

struct Options {
  std::string config = "k3-tiny";
  int prompt_tokens = 32000;
  int streams = 4, window = 200, stream_tokens = 128;  // the decoding streams
  // SchedulerOptions
  int max_batch_tokens = 2048;
  double target_factor = SchedulerOptions().step_target_factor;
};

// Parses the command line into `options`; the exit status when the bench should not run (0 for
// --help, 2 for bad flags, with the parser's message printed).
std::optional<int> ParseOptions(int argc, char** argv, Options* options) {
  constexpr int kMost = std::numeric_limits<int>::max();
  CLI::App app{"itl_bench: inter-token latency of decoding streams while a prompt is admitted"};
  app.add_option("--config", options->config, "named model config")->capture_default_str();
  AddBoundedInt(&app, "--prompt-tokens", &options->prompt_tokens, 1, kMost, "the long prompt");
  AddBoundedInt(&app, "--streams", &options->streams, 1, kMost, "decoding streams");
  AddBoundedInt(&app, "--window", &options->window, 2, kMost,
                "tokens per stream measured without the long prompt");
  AddBoundedInt(&app, "--stream-tokens", &options->stream_tokens, 2, kMost,
                "new tokens of each stream's requests");
  AddBoundedInt(&app, "--max-batch-tokens", &options->max_batch_tokens, 1, kMost,
                "SchedulerOptions::max_batch_tokens");
  app.add_option("--target-factor", options->target_factor,
                 "SchedulerOptions::step_target_factor")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  return ParseToolArgs(&app, {argv + 1, argv + argc});
}

// Token times of every stream's requests and of the long prompt. Written on the scheduler thread;
// the driver thread waits on it for finished requests.
class Recorder {
 public:
  class Sink : public GenerationSink {
   public:
    Sink(Recorder* recorder, int stream) : recorder_(recorder), stream_(stream) {}
    void OnToken(int32_t token, int, int) override { recorder_->Token(stream_, token); }
    void OnFinish(const GenerationResult& result) override { recorder_->Finish(stream_); }

   private:
    Recorder* recorder_;
    int stream_;
  };

  // Streams 0..streams-1 decode; stream `streams` is the long prompt.
  explicit Recorder(int streams) : times_(streams + 1), finished_(streams + 1, 0) {}

  int long_stream() const { return static_cast<int>(times_.size()) - 1; }

  // A new request of `stream` starts: its tokens go to a list of their own, so that the gap
  // between two requests (a new prompt's time to first token) is not counted as inter-token.
  void StartRequest(int stream) {
    absl::MutexLock lock(&mu_);
    times_[stream].emplace_back();
  }
  void Token(int stream, int32_t token) {
    absl::MutexLock lock(&mu_);
    times_[stream].back().push_back(absl::Now());
    if (stream == long_stream()) long_token_ = token;
  }
  void Finish(int stream) {
    absl::MutexLock lock(&mu_);
    ++finished_[stream];
  }
  // Waits until a decoding stream's current request finished and returns the stream, or -1
  // once Stop() was called.
  int AwaitFinishedRequest() {
    absl::MutexLock lock(&mu_);
    int found = -1;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopped_) return true;
      for (int s = 0; s < long_stream(); ++s) {
        if (finished_[s] == static_cast<int>(times_[s].size())) {
          found = s;
          return true;
        }
      }
      return false;
    };
    mu_.Await(absl::Condition(&ready));
    return stopped_ ? -1 : found;
  }
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  // Waits until every decoding stream has `tokens` tokens over its requests.
  void AwaitTokens(size_t tokens) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (int s = 0; s < long_stream(); ++s) {
        if (TokensLocked(s) < tokens) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&ready));
  }
  void AwaitLongFinished() {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_[long_stream()] > 0; };
    mu_.Await(absl::Condition(&done));
  }
  size_t MinTokens() {
    absl::MutexLock lock(&mu_);
    size_t least = SIZE_MAX;
    for (int s = 0; s < long_stream(); ++s) least = std::min(least, TokensLocked(s));
    return least;
  }
  // Gaps (seconds) between consecutive tokens of one request of a decoding stream, for tokens
  // that arrived in (from, to].
  std::vector<double> Gaps(absl::Time from, absl::Time to) {
    absl::MutexLock lock(&mu_);
    std::vector<double> gaps;
    for (int s = 0; s < long_stream(); ++s) {
      for (const std::vector<absl::Time>& request : times_[s]) {
        for (size_t i = 1; i < request.size(); ++i) {
          if (request[i] > from && request[i] <= to) {
            gaps.push_back(absl::ToDoubleSeconds(request[i] - request[i - 1]));
          }
        }
      }
    }
    return gaps;
  }
  absl::Time LongFirstToken() {
    absl::MutexLock lock(&mu_);
    return times_.back().front().front();
  }
  int32_t long_token() {
    absl::MutexLock lock(&mu_);
    return long_token_;
  }

 private:
  size_t TokensLocked(int stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t tokens = 0;
    for (const std::vector<absl::Time>& request : times_[stream]) tokens += request.size();
    return tokens;
  }

  absl::Mutex mu_;
  // [stream][request][token]
  std::vector<std::vector<std::vector<absl::Time>>> times_ ABSL_GUARDED_BY(mu_);
  std::vector<int> finished_ ABSL_GUARDED_BY(mu_);  // finished requests per stream
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int32_t long_token_ ABSL_GUARDED_BY(mu_) = -1;
};

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  return values[index];
}

struct Result {
  double p50_without = 0, p99_without = 0, p50_with = 0, p99_with = 0;
  size_t gaps_without = 0, gaps_with = 0;
  double prefill_seconds = 0;
  int32_t long_token = -1;
};

SchedulerOptions BenchSchedulerOptions(const Options& options, bool adaptive) {
  SchedulerOptions scheduler_options;
  scheduler_options.max_batch_tokens = options.max_batch_tokens;
  scheduler_options.max_prompt_tokens = std::max(options.prompt_tokens, 1);
  scheduler_options.max_new_tokens_limit = 1 << 20;
  scheduler_options.adaptive_prefill = adaptive;
  scheduler_options.step_target_factor = options.target_factor;
  return scheduler_options;
}

// The long prompt: `tokens` tokens, one new token wanted.
GenerationRequest LongPromptRequest(int tokens, int vocab) {
  GenerationRequest request;
  for (int t = 0; t < tokens; ++t) request.prompt.push_back((t * 7919 + 3) % vocab);
  request.max_new_tokens = 1;
  request.ignore_eos = true;
  return request;
}

// The gaps without the long prompt (tokens in (without_from, without_to]) and with it (from its
// submission at with_from on; with_to is its first token).
Result Summarize(Recorder& recorder, absl::Time without_from, absl::Time without_to,
                 absl::Time with_from, absl::Time with_to) {
  Result result;
  const std::vector<double> without = recorder.Gaps(without_from, without_to);
  const std::vector<double> with = recorder.Gaps(with_from, with_to + absl::Seconds(3600));
  result.p50_without = Percentile(without, 0.50);
  result.p99_without = Percentile(without, 0.99);
  result.p50_with = Percentile(with, 0.50);
  result.p99_with = Percentile(with, 0.99);
  result.gaps_without = without.size();
  result.gaps_with = with.size();
  result.prefill_seconds = absl::ToDoubleSeconds(with_to - with_from);
  result.long_token = recorder.long_token();
  return result;
}

absl::StatusOr<Result> Run(const ModelWeights& weights, const Options& options, bool adaptive) {
  // Declared first, so that it outlives the scheduler: a sink's OnFinish may still run after
  // WaitIdle returns (the request leaves the in-flight set just before it).
  Recorder recorder(options.streams);
  LocalRoutedMoe moe(&weights);
  GenerationScheduler scheduler(&weights, &moe, BenchSchedulerOptions(options, adaptive), nullptr);
  const int vocab = static_cast<int>(weights.config.vocab_size);

  // Each stream is a run of requests of `stream_tokens` new tokens after an 8-token prompt, the
  // next submitted when one finishes, so that the streams' contexts stay short and alike with
  // and without the long prompt (streams that ran on would reach 30k tokens during a 32k
  // admission, and their own attention would set their gaps).
  std::vector<std::shared_ptr<RequestHandle>> handles;
  int submitted = 0;
  auto submit = [&](int s) -> absl::Status {
    GenerationRequest request;
    for (int t = 0; t < 8; ++t) request.prompt.push_back((s * 131 + t * 17 + submitted) % vocab);
    request.max_new_tokens = options.stream_tokens;
    request.ignore_eos = true;
    ++submitted;
    recorder.StartRequest(s);
    K3_ASSIGN_OR_RETURN(
        std::shared_ptr<RequestHandle> handle,
        scheduler.Submit(std::move(request), std::make_shared<Recorder::Sink>(&recorder, s)));
    handles.push_back(handle);
    return absl::OkStatus();
  };
  for (int s = 0; s < options.streams; ++s) {
    K3_RETURN_IF_ERROR(submit(s));
  }
  absl::Status driver_status;
  std::thread driver([&] {
    for (int s; (s = recorder.AwaitFinishedRequest()) >= 0;) {
      if (absl::Status status = submit(s); !status.ok()) {
        driver_status = status;
        return;
      }
    }
  });
  // Warm up, then the window without the long prompt.
  recorder.AwaitTokens(20);
  const absl::Time without_from = absl::Now();
  recorder.AwaitTokens(20 + options.window);
  const absl::Time without_to = absl::Now();

  GenerationRequest long_request = LongPromptRequest(options.prompt_tokens, vocab);
  const absl::Time with_from = absl::Now();
  recorder.StartRequest(recorder.long_stream());
  absl::StatusOr<std::shared_ptr<RequestHandle>> long_handle = scheduler.Submit(
      std::move(long_request), std::make_shared<Recorder::Sink>(&recorder, options.streams));
  absl::Status status = long_handle.status();
  if (status.ok()) {
    recorder.AwaitLongFinished();
    // The gap that spans the prompt's last step ends after it: take the streams' next token too.
    recorder.AwaitTokens(recorder.MinTokens() + 1);
  }
  recorder.Stop();
  driver.join();
  scheduler.CancelAll(absl::OkStatus());
  scheduler.WaitIdle(absl::InfiniteFuture());
  if (!status.ok()) return status;
  if (!driver_status.ok()) return driver_status;
  const absl::Time with_to = recorder.LongFirstToken();

  return Summarize(recorder, without_from, without_to, with_from, with_to);
}

int Main(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_status = ParseOptions(argc, argv, &options)) return *exit_status;
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      CachedRandomWeights(options.config, "k3serve-itl-bench-");
  if (!weights.ok()) {
    std::fprintf(stderr, "itl_bench: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  std::printf("itl_bench: %s, %d decoding streams, a %d-token prompt admitted, "
              "max_batch_tokens %d\n",
              options.config.c_str(), options.streams, options.prompt_tokens,
              options.max_batch_tokens);
  std::printf("%-9s %12s %12s %12s %12s %10s %11s %7s\n", "prefill", "p50 without", "p99 without",
              "p50 with", "p99 with", "p99 ratio", "prefill s", "gaps");
  int32_t tokens[2] = {-1, -1};
  double ratios[2] = {0, 0};
  for (int adaptive = 0; adaptive < 2; ++adaptive) {
    absl::StatusOr<Result> r = Run(**weights, options, adaptive == 1);
    if (!r.ok()) {
      std::fprintf(stderr, "itl_bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
    ratios[adaptive] = r->p99_with / r->p99_without;
    tokens[adaptive] = r->long_token;
    std::printf("%-9s %10.2fms %10.2fms %10.2fms %10.2fms %9.2fx %10.2fs %3zu/%zu\n",
                adaptive ? "adaptive" : "fixed", r->p50_without * 1e3, r->p99_without * 1e3,
                r->p50_with * 1e3, r->p99_with * 1e3, ratios[adaptive], r->prefill_seconds,
                r->gaps_without, r->gaps_with);
    std::fflush(stdout);
  }
  std::printf("adaptive p99 ratio %.2fx (goal <= 3x); fixed %.2fx; long prompt's first token "
              "%s (%d vs %d)\n",
              ratios[1], ratios[0], tokens[0] == tokens[1] ? "identical" : "DIFFERS", tokens[0],
              tokens[1]);
  return tokens[0] == tokens[1] ? 0 : 1;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) { return k3::bench::Main(argc, argv); }
