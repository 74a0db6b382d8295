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
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention_nodes/generation_scheduler.h"
#include "engine/local_routed_moe.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "tools/random_model_folder.h"

namespace k3::bench {
namespace {

struct Options {
  std::string config = "k3-tiny";
  int prompt_tokens = 32000;
  int streams = 4;
  int window = 200;
  int max_batch_tokens = 2048;
  int stream_tokens = 128;
  double target_factor = SchedulerOptions().step_target_factor;
};

bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--config") {
      options->config = value;
    } else if (flag == "--prompt-tokens" && absl::SimpleAtoi(value, &options->prompt_tokens)) {
    } else if (flag == "--streams" && absl::SimpleAtoi(value, &options->streams)) {
    } else if (flag == "--window" && absl::SimpleAtoi(value, &options->window)) {
    } else if (flag == "--stream-tokens" && absl::SimpleAtoi(value, &options->stream_tokens)) {
    } else if (flag == "--target-factor" && absl::SimpleAtod(value, &options->target_factor)) {
    } else if (flag == "--max-batch-tokens" &&
               absl::SimpleAtoi(value, &options->max_batch_tokens)) {
    } else {
      std::fprintf(stderr, "itl_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  return argc % 2 == 1 && options->prompt_tokens > 0 && options->streams > 0 &&
         options->window > 1 && options->max_batch_tokens > 0 && options->stream_tokens > 1 &&
         options->target_factor >= 1.0;
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

absl::StatusOr<Result> Run(const ModelWeights& weights, const Options& options, bool adaptive) {
  // Declared first, so that it outlives the scheduler: a sink's OnFinish may still run after
  // WaitIdle returns (the request leaves the in-flight set just before it).
  Recorder recorder(options.streams);
  LocalRoutedMoe moe(&weights);
  SchedulerOptions scheduler_options;
  scheduler_options.max_batch_tokens = options.max_batch_tokens;
  scheduler_options.max_prompt_tokens = std::max(options.prompt_tokens, 1);
  scheduler_options.max_new_tokens_limit = 1 << 20;
  scheduler_options.adaptive_prefill = adaptive;
  scheduler_options.step_target_factor = options.target_factor;
  GenerationScheduler scheduler(&weights, &moe, scheduler_options, nullptr);
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
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        scheduler.Submit(std::move(request), std::make_shared<Recorder::Sink>(&recorder, s));
    if (!handle.ok()) return handle.status();
    handles.push_back(*handle);
    return absl::OkStatus();
  };
  for (int s = 0; s < options.streams; ++s) {
    if (absl::Status status = submit(s); !status.ok()) return status;
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

  GenerationRequest long_request;
  for (int t = 0; t < options.prompt_tokens; ++t) {
    long_request.prompt.push_back((t * 7919 + 3) % vocab);
  }
  long_request.max_new_tokens = 1;
  long_request.ignore_eos = true;
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

int Main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: itl_bench [--config NAME] [--prompt-tokens N] [--streams N] "
                 "[--window N] [--stream-tokens N] [--max-batch-tokens N] [--target-factor X]\n");
    return 2;
  }
  absl::StatusOr<ModelConfig> config = NamedConfig(options.config);
  if (!config.ok()) {
    std::fprintf(stderr, "itl_bench: %s\n", config.status().ToString().c_str());
    return 1;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("k3serve-itl-bench-" + options.config);
  if (!std::filesystem::exists(dir / "config.json")) {
    if (absl::Status s = WriteRandomModelFolder(*config, 1, dir.string()); !s.ok()) {
      std::fprintf(stderr, "itl_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.string());
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "itl_bench: %s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(
      std::shared_ptr<const Checkpoint>(std::move(*checkpoint)), WeightSelection::All());
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
