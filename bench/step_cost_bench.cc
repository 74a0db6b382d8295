// step_cost_bench: what one attention-worker step costs as a function of what it carries, in
// process (ModelRunner over LocalRoutedMoe: no wire), on a random checkpoint:
//   - decode: n sequences with a `--context`-token history each append one token;
//   - prefill: one sequence appends an m-token chunk after the same history;
//   - mixed: n decode tokens plus one m-token chunk (what the scheduler packs under load).
// Each shape is timed `--repeats` times, rounds interleaved across shapes (the host is noisy);
// it prints the median and range per shape, the per-token cost of each shape over a one-token
// step, and the step's share in the profile's MoE part (the routed experts, in process here).
//
//   bazel-bin/bench/step_cost_bench [--config k3-tiny] [--context 200] [--repeats 15]
//                                   [--only-decode N --only-prefill M: that shape and one token]
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attention_nodes/forward/model_runner.h"
#include "base/status_macros.h"
#include "bench/random_weights.h"
#include "cluster/command_line.h"
#include "engine/local_routed_moe.h"
#include "model/weights.h"

namespace k3::bench {
namespace {

struct Options {
  std::string config = "k3-tiny";
  int context = 200;
  int repeats = 15;
  int only_decode = -1;  // with only_prefill: time just this shape (for a profiler)
  int only_prefill = -1;
};

// Parses the command line into `options`; the exit status when the bench should not run.
std::optional<int> ParseOptions(int argc, char** argv, Options* options) {
  CLI::App app{"step_cost_bench: one attention-worker step's time against what it carries"};
  app.add_option("--config", options->config, "named model config")->capture_default_str();
  constexpr int kMost = std::numeric_limits<int>::max();
  AddBoundedInt(&app, "--context", &options->context, 1, kMost, "history tokens per sequence");
  AddBoundedInt(&app, "--repeats", &options->repeats, 1, kMost, "timed rounds per shape");
  // The histories are made for at most 32 decode sequences.
  AddBoundedInt(&app, "--only-decode", &options->only_decode, 0, 32,
                "with --only-prefill: time just this shape and one token (for a profiler)");
  AddBoundedInt(&app, "--only-prefill", &options->only_prefill, 0, kMost,
                "the prefill chunk of --only-decode's shape");
  return ParseToolArgs(&app, {argv + 1, argv + argc});
}

struct Shape {
  int decode = 0;   // sequences appending one token
  int prefill = 0;  // tokens of one chunk (0: none)
  std::vector<double> ms;
};

std::vector<int32_t> RandomTokens(int count, int vocab, std::mt19937* rng) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = pick(*rng);
  return tokens;
}

// Sequences with `context` tokens consumed each.
absl::StatusOr<std::vector<std::unique_ptr<SequenceState>>> Histories(ModelRunner& runner,
                                                                      int count, int context,
                                                                      std::mt19937* rng) {
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<float> logits;
  for (int i = 0; i < count; ++i) {
    states.push_back(runner.NewSequence());
    const std::vector<int32_t> prompt = RandomTokens(context, runner.config().vocab_size, rng);
    BatchEntry entry;
    entry.state = states.back().get();
    entry.tokens = prompt;
    K3_RETURN_IF_ERROR(runner.Step({&entry, 1}, &logits));
  }
  return states;
}

// One step of `shape` on copies of the histories; its wall time in ms.
absl::StatusOr<double> TimeStep(ModelRunner& runner, const Shape& shape,
                                const std::vector<std::unique_ptr<SequenceState>>& histories,
                                std::mt19937* rng) {
  std::vector<SequenceState> states;
  const int sequences = shape.decode + (shape.prefill > 0 ? 1 : 0);
  states.reserve(sequences);
  for (int i = 0; i < sequences; ++i) {
    states.push_back(*histories[i]);
    // A copy's MLA cache has no spare capacity; a served sequence's grows geometrically, so its
    // appends do not reallocate. Made room for before the clock starts.
    for (MlaCache& cache : states.back().mla) {
      if (cache.width() > 0) cache.Reserve(2 * (cache.length + shape.prefill + 1));
    }
  }
  std::vector<std::vector<int32_t>> tokens;
  std::vector<BatchEntry> batch;
  for (int i = 0; i < sequences; ++i) {
    const bool chunk = i == shape.decode;
    tokens.push_back(RandomTokens(chunk ? shape.prefill : 1, runner.config().vocab_size, rng));
  }
  for (int i = 0; i < sequences; ++i) {
    BatchEntry entry;
    entry.state = &states[i];
    entry.tokens = tokens[i];
    batch.push_back(entry);
  }
  std::vector<float> logits;
  const absl::Time start = absl::Now();
  K3_RETURN_IF_ERROR(runner.Step(batch, &logits));
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(const Options& options) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      CachedRandomWeights(options.config, "k3serve-step-cost-bench-");
  if (!weights.ok()) {
    std::fprintf(stderr, "step_cost_bench: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  LocalRoutedMoe moe(weights->get());
  ModelRunner runner(weights->get(), &moe);
  runner.set_ping_pong(PingPong::kOff);
  std::vector<Shape> shapes;
  for (int n : {1, 2, 4, 8, 16, 32}) shapes.push_back({n, 0, {}});
  for (int m : {16, 32, 64, 128, 256}) shapes.push_back({0, m, {}});
  for (int m : {16, 32, 64}) shapes.push_back({16, m, {}});
  if (options.only_decode >= 0) {
    shapes = {Shape{1, 0, {}}, Shape{options.only_decode, std::max(options.only_prefill, 0), {}}};
  }
  std::mt19937 rng(7);
  absl::StatusOr<std::vector<std::unique_ptr<SequenceState>>> histories =
      Histories(runner, 33, options.context, &rng);
  if (!histories.ok()) {
    std::fprintf(stderr, "step_cost_bench: %s\n", histories.status().ToString().c_str());
    return 1;
  }
  for (int round = 0; round < options.repeats + 1; ++round) {
    for (Shape& shape : shapes) {
      absl::StatusOr<double> ms = TimeStep(runner, shape, *histories, &rng);
      if (!ms.ok()) {
        std::fprintf(stderr, "step_cost_bench: %s\n", ms.status().ToString().c_str());
        return 1;
      }
      if (round > 0) shape.ms.push_back(*ms);  // round 0 warms caches and buffers
    }
  }
  const double one = Median(shapes[0].ms);
  std::printf("step_cost_bench: %s, %d-token histories, %d rounds interleaved, in process\n",
              options.config.c_str(), options.context, options.repeats);
  std::printf("%7s %8s %7s %10s %10s %10s %16s\n", "decode", "prefill", "tokens", "median ms",
              "min ms", "max ms", "ms/token over 1");
  for (const Shape& shape : shapes) {
    const int tokens = shape.decode + shape.prefill;
    const double median = Median(shape.ms);
    const auto [low, high] = std::minmax_element(shape.ms.begin(), shape.ms.end());
    std::printf("%7d %8d %7d %10.3f %10.3f %10.3f %16.4f\n", shape.decode, shape.prefill, tokens,
                median, *low, *high, tokens > 1 ? (median - one) / (tokens - 1) : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) {
  k3::bench::Options options;
  if (std::optional<int> exit_status = k3::bench::ParseOptions(argc, argv, &options)) {
    return *exit_status;
  }
  return k3::bench::Run(options);
}
