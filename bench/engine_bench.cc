// engine_bench: the whole single-process engine on the spec's k3-perf checkpoint (§12.6), as
// fractions of this machine's limits measured in the same run:
//   decode:  tokens/s ÷ (read bandwidth / active weight bytes per token)       goal >= 0.7
//   prefill: tokens/s ÷ (bf16 peak / (2 × active parameters per token))         goal >= 0.4
// and where a decode step's time goes (kernels/step_profile.h: products, fork-join waits, norms,
// Block AttnRes, the mixers' own work, MoE routing, gated-MLP activations, and the rest), from one
// more decode run with the profile on.
// Active weight bytes are the files' bytes a decoded token reads (tools/memory_plan.h), so MXFP4
// experts count their codes and scales.
//
//   bazel run -c opt //bench:engine_bench -- [--model DIR] [--decode-tokens N] [--prompt-tokens N]
//
// Without --model it benchmarks two random k3-perf checkpoints side by side, one BF16 and one with
// MXFP4 routed experts, written under $TMPDIR once (1.4 GB and 1.2 GB).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "cluster/command_line.h"
#include "engine/local_engine.h"
#include "bench/machine_limits.h"
#include "kernels/kernel_isa.h"
#include "kernels/step_profile.h"
#include "kernels/thread_pool.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "tools/memory_plan.h"

namespace k3::bench {
namespace {

constexpr int kRepetitions = 3;

struct Options {
  std::string model;
  int decode_tokens = 64;
  int prompt_tokens = 256;
};

// Parses the command line into `options`; the exit status when the bench should not run (0 for
// --help, 2 for bad flags, with the parser's message printed).
std::optional<int> ParseOptions(int argc, char** argv, Options* options) {
  CLI::App app{"engine_bench: the single-process engine against this machine's limits"};
  app.add_option("--model", options->model,
                 "checkpoint folder (default: random k3-perf checkpoints, BF16 and MXFP4)");
  AddBoundedInt(&app, "--decode-tokens", &options->decode_tokens, 2,
                std::numeric_limits<int>::max(), "single-token steps timed after the prefill");
  AddBoundedInt(&app, "--prompt-tokens", &options->prompt_tokens, 1,
                std::numeric_limits<int>::max(), "tokens of the prefill timed");
  return ParseToolArgs(&app, {argv + 1, argv + argc});
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
    K3_RETURN_IF_ERROR(runner.Step({entry}, &logits));
    *prefill_seconds = std::min(*prefill_seconds, NowSeconds() - start);
    int32_t next = 1;
    start = NowSeconds();
    for (int t = 0; t < decode_tokens; ++t) {
      BatchEntry step{state.get(), absl::MakeConstSpan(&next, 1), false};
      K3_RETURN_IF_ERROR(runner.Step({step}, &logits));
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    *decode_seconds = std::min(*decode_seconds, NowSeconds() - start);
  }
  return absl::OkStatus();
}

// The random k3-perf checkpoint under $TMPDIR (BF16, or with MXFP4 routed experts), written once.
absl::StatusOr<std::string> PerfCheckpoint(bool mxfp4) {
  K3_ASSIGN_OR_RETURN(ModelConfig perf, NamedConfig("k3-perf"));
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir =
      std::string(tmp ? tmp : "/tmp") + "/k3serve-k3-perf" + (mxfp4 ? "-mxfp4" : "");
  if (!std::filesystem::exists(dir + "/config.json")) {
    std::printf("writing a random k3-perf checkpoint to %s\n", dir.c_str());
    RandomCheckpointOptions options;
    options.mxfp4 = mxfp4;
    K3_RETURN_IF_ERROR(WriteRandomCheckpoint(perf, 1, dir, options));
  }
  return dir;
}

struct Measured {
  std::string model;
  double active_params = 0, active_bytes = 0;  // per decoded token
  double prefill_seconds = 0, decode_seconds = 0;
  // One more decode of the same length with the step profile on: its seconds and the parts'.
  double profiled_seconds = 0;
  StepPartTotals parts;
};

// Decodes `decode_tokens` tokens after `prompt` with the step profile on.
absl::Status ProfileDecode(LocalEngine& engine, const std::vector<int32_t>& prompt,
                           int decode_tokens, Measured* m) {
  ModelRunner& runner = engine.runner();
  std::vector<float> logits;
  std::unique_ptr<SequenceState> state = runner.NewSequence();
  BatchEntry entry{state.get(), absl::MakeConstSpan(prompt), false};
  K3_RETURN_IF_ERROR(runner.Step({entry}, &logits));
  int32_t next = 1;
  TakeStepProfile();
  EnableStepProfile(true);
  const double start = NowSeconds();
  for (int t = 0; t < decode_tokens; ++t) {
    BatchEntry step{state.get(), absl::MakeConstSpan(&next, 1), false};
    if (absl::Status s = runner.Step({step}, &logits); !s.ok()) {
      EnableStepProfile(false);
      return s;
    }
    next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  m->profiled_seconds = NowSeconds() - start;
  EnableStepProfile(false);
  m->parts = TakeStepProfile();
  return absl::OkStatus();
}

// The profiled decode's time per token by part, and what is left outside every part.
void PrintBreakdown(const Measured& m, int decode_tokens) {
  const double step = m.profiled_seconds / decode_tokens;
  std::printf("  decode step breakdown (profiled run, %.2f ms/token):", 1e3 * step);
  double parts = 0;
  for (int i = 0; i < static_cast<int>(StepPart::kCount); ++i) {
    const double s = m.parts.seconds[i] / decode_tokens;
    parts += s;
    std::printf(" %s %.3f ms (%.0f%%, %.0f calls);", StepPartName(static_cast<StepPart>(i)), 1e3 * s,
                100 * s / step, static_cast<double>(m.parts.calls[i]) / decode_tokens);
  }
  std::printf(" rest %.3f ms (%.0f%%)\n", 1e3 * (step - parts), 100 * (step - parts) / step);
}

absl::StatusOr<Measured> Measure(const std::string& model, const Options& options) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine, LocalEngine::Open(model));
  // Weight bytes a decoded token reads, from the files (MXFP4 experts: codes + scales).
  K3_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(model, {}));
  const ModelConfig& config = engine->config();
  Measured m{model, static_cast<double>(ActiveParameters(config)),
             static_cast<double>(plan.attention_token_bytes + plan.router_token_bytes +
                                 plan.expert_token_bytes)};
  std::printf("%s: %d layers, %.1fM active parameters, %.0f MB of weights read per decoded token\n",
              model.c_str(), config.num_hidden_layers, m.active_params / 1e6, m.active_bytes / 1e6);
  const std::vector<int32_t> prompt = Prompt(options.prompt_tokens, config.vocab_size);
  if (absl::Status s =
          TimeEngine(*engine, prompt, options.decode_tokens, &m.prefill_seconds, &m.decode_seconds);
      !s.ok()) {
    return s;
  }
  K3_RETURN_IF_ERROR(ProfileDecode(*engine, prompt, options.decode_tokens, &m));
  return m;
}

int Main(int argc, char** argv) {
  Options options;
  if (std::optional<int> exit_status = ParseOptions(argc, argv, &options)) return *exit_status;
  if (!HasLimitLoops()) {
    std::printf("engine_bench needs AVX2 for its limit loops\n");
    return 1;
  }
  std::vector<std::string> models = {options.model};
  if (options.model.empty()) {
    models.clear();
    for (bool mxfp4 : {false, true}) {
      absl::StatusOr<std::string> dir = PerfCheckpoint(mxfp4);
      if (!dir.ok()) {
        std::fprintf(stderr, "%s\n", dir.status().ToString().c_str());
        return 1;
      }
      models.push_back(*dir);
    }
  }
  std::printf("k3 engine_bench: kernel pool %d threads, matrix kernels %s (K3SERVE_ISA)\n",
              KernelThreadCount(), KernelIsaName(ActiveKernelIsa()));
  MachineLimits limits = MeasureMachineLimits();
  std::vector<Measured> results;
  for (const std::string& model : models) {
    absl::StatusOr<Measured> m = Measure(model, options);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    results.push_back(*m);
  }
  limits = BestOf(limits, MeasureMachineLimits());

  std::printf("\nLimits (best of before and after): read %.1f GB/s, bf16 %.0f GFLOP/s\n",
              limits.read_gbs, limits.bf16_gflops);
  for (const Measured& m : results) {
    const double decode_rate = options.decode_tokens / m.decode_seconds;
    const double decode_limit = limits.read_gbs * 1e9 / m.active_bytes;
    const double prefill_rate = options.prompt_tokens / m.prefill_seconds;
    const double prefill_limit = limits.bf16_gflops * 1e9 / (2 * m.active_params);
    std::printf("%s\n", m.model.c_str());
    std::printf(
        "  decode  (1 sequence, %d tokens): %7.1f tokens/s = %.2f of read bandwidth / "
        "active bytes (%.1f tokens/s; goal 0.7)\n",
        options.decode_tokens, decode_rate, decode_rate / decode_limit, decode_limit);
    PrintBreakdown(m, options.decode_tokens);
    std::printf(
        "  prefill (%d tokens):             %7.1f tokens/s = %.2f of bf16 peak / (2 x "
        "active parameters) (%.0f tokens/s; goal 0.4)\n",
        options.prompt_tokens, prefill_rate, prefill_rate / prefill_limit, prefill_limit);
  }
  return 0;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) { return k3::bench::Main(argc, argv); }
