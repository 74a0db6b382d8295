// engine_bench: the whole single-process engine on the spec's k3-perf checkpoint (§12.6), as
// fractions of this machine's limits measured in the same run:
//   decode:  tokens/s ÷ (read bandwidth / active weight bytes per token)       goal >= 0.7
//   prefill: tokens/s ÷ (bf16 peak / (2 × active parameters per token))         goal >= 0.4
//
//   bazel run -c opt //bench:engine_bench -- [--model DIR] [--decode-tokens N] [--prompt-tokens N]
//
// Without --model it writes a random k3-perf checkpoint under $TMPDIR (1.4 GB, once).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "engine/local_engine.h"
#include "bench/machine_limits.h"
#include "kernels/thread_pool.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

namespace k3::bench {
namespace {

constexpr int kRepetitions = 3;

struct Options {
  std::string model;
  int decode_tokens = 64;
  int prompt_tokens = 256;
};

bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      options->model = value;
    } else if (flag == "--decode-tokens" && absl::SimpleAtoi(value, &options->decode_tokens)) {
    } else if (flag == "--prompt-tokens" && absl::SimpleAtoi(value, &options->prompt_tokens)) {
    } else {
      std::fprintf(stderr, "engine_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  return argc % 2 == 1 && options->decode_tokens > 1 && options->prompt_tokens > 0;
}

std::vector<int32_t> Prompt(int count, int64_t vocab) {
  std::vector<int32_t> tokens(count);
  for (int i = 0; i < count; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  return tokens;
}

// Best seconds of one prefill of `prompt` and of `decode_tokens` single-token steps after it.
absl::Status TimeEngine(LocalEngine& engine, const std::vector<int32_t>& prompt,
                        int decode_tokens, double* prefill_seconds, double* decode_seconds) {
  ModelRunner& runner = engine.runner();
  std::vector<float> logits;
  *prefill_seconds = *decode_seconds = 1e30;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    std::unique_ptr<SequenceState> state = runner.NewSequence();
    double start = NowSeconds();
    BatchEntry entry{state.get(), absl::MakeConstSpan(prompt), false};
    if (absl::Status s = runner.Step({entry}, &logits); !s.ok()) return s;
    *prefill_seconds = std::min(*prefill_seconds, NowSeconds() - start);
    int32_t next = 1;
    start = NowSeconds();
    for (int t = 0; t < decode_tokens; ++t) {
      BatchEntry step{state.get(), absl::MakeConstSpan(&next, 1), false};
      if (absl::Status s = runner.Step({step}, &logits); !s.ok()) return s;
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    *decode_seconds = std::min(*decode_seconds, NowSeconds() - start);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) return 2;
  if (!HasLimitLoops()) {
    std::printf("engine_bench needs AVX-512 with avx512_bf16 for its limit loops\n");
    return 1;
  }
  absl::StatusOr<ModelConfig> perf = NamedConfig("k3-perf");
  if (!perf.ok()) return 1;
  if (options.model.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    options.model = std::string(tmp ? tmp : "/tmp") + "/k3serve-k3-perf";
    if (!std::filesystem::exists(options.model + "/config.json")) {
      std::printf("writing a random k3-perf checkpoint to %s\n", options.model.c_str());
      if (absl::Status s = WriteRandomCheckpoint(*perf, 1, options.model, 1); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(options.model);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = (*engine)->config();
  const double active = static_cast<double>(ActiveParameters(config));
  const double active_bytes = 2 * active;  // BF16
  std::printf("k3 engine_bench: %s, %d layers, %.1fM active parameters (%.0f MB BF16 read per "
              "decoded token), kernel pool %d threads\n",
              options.model.c_str(), config.num_hidden_layers, active / 1e6, active_bytes / 1e6,
              KernelThreadCount());

  MachineLimits limits = MeasureMachineLimits();
  const std::vector<int32_t> prompt = Prompt(options.prompt_tokens, config.vocab_size);
  double prefill = 0, decode = 0;
  if (absl::Status s = TimeEngine(**engine, prompt, options.decode_tokens, &prefill, &decode);
      !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  limits = BestOf(limits, MeasureMachineLimits());

  const double decode_rate = options.decode_tokens / decode;
  const double decode_limit = limits.read_gbs * 1e9 / active_bytes;
  const double prefill_rate = options.prompt_tokens / prefill;
  const double prefill_limit = limits.bf16_gflops * 1e9 / (2 * active);
  std::printf("\nLimits (best of before and after): read %.1f GB/s, bf16 %.0f GFLOP/s\n",
              limits.read_gbs, limits.bf16_gflops);
  std::printf("decode  (1 sequence, %d tokens): %7.1f tokens/s = %.2f of read bandwidth / active "
              "bytes (%.1f tokens/s; goal 0.7)\n",
              options.decode_tokens, decode_rate, decode_rate / decode_limit, decode_limit);
  std::printf("prefill (%d tokens):             %7.1f tokens/s = %.2f of bf16 peak / (2 x active "
              "parameters) (%.0f tokens/s; goal 0.4)\n",
              options.prompt_tokens, prefill_rate, prefill_rate / prefill_limit, prefill_limit);
  return 0;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) { return k3::bench::Main(argc, argv); }
