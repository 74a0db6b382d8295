// MLA decode over a long context: one query token (absorbed form, spec §6.2) of one layer over a
// latent cache of N tokens, beside the same cache read by the machine's read loop. The cache is
// what a decode step of a long sequence streams (N x (kv_lora_rank + qk_rope_head_dim) floats per
// MLA layer), so its read bandwidth bounds the step; the ratio says how close the kernel gets.
//
//   bazel-bin/bench/mla_bench [--configs k3-tiny,k3-perf] [--contexts 2048,8192,32768]
//
// Prints per config and context: microseconds per token and layer, GB/s of cache read, GFLOP/s
// (scores and values: 2 x heads x (width + kv_lora_rank) per cached token), and the fraction of
// the machine's limit measured in the same run: the longer of reading the cache at the read
// bandwidth and doing the FMAs at the fp32 peak (2 threads, K3SERVE_THREADS). With many heads
// (k3-perf: 16) the absorbed form does 8 FLOP per byte of cache and is compute-bound.
#include <algorithm>
#include <cstdio>
#include <random>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "attention_nodes/forward/mla.h"
#include "bench/machine_limits.h"
#include "cluster/command_line.h"
#include "kernels/thread_pool.h"
#include "model/config.h"

namespace k3::bench {
namespace {

// Random f32 weights of the layer's shapes (values only need to be finite and moderate).
struct RandomMla {
  std::vector<std::vector<float>> storage;
  MlaWeights w;
  std::mt19937 rng{7};

  WeightMatrix Matrix(int64_t rows, int64_t cols, float scale) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float>& data = storage.emplace_back(rows * cols);
    for (float& v : data) v = normal(rng);
    WeightMatrix m;
    m.data = data.data();
    m.type = WeightType::kF32;
    m.rows = rows;
    m.cols = cols;
    return m;
  }
  std::vector<float> Vector(int64_t n) { return std::vector<float>(n, 1.0f); }

  explicit RandomMla(const ModelConfig& config) {
    const int h = config.num_attention_heads, d = config.hidden_size;
    const int qhd = config.MlaQHeadDim(), c = config.kv_lora_rank, r = config.qk_rope_head_dim;
    const int vd = config.v_head_dim;
    if (config.q_lora_rank) {
      w.q_a_proj = Matrix(*config.q_lora_rank, d, 0.05f);
      w.q_a_layernorm = Vector(*config.q_lora_rank);
      w.q_b_proj = Matrix(h * qhd, *config.q_lora_rank, 0.05f);
    } else {
      w.q_proj = Matrix(h * qhd, d, 0.05f);
    }
    w.kv_a_proj_with_mqa = Matrix(c + r, d, 0.05f);
    w.kv_a_layernorm = Vector(c);
    w.kv_b_proj = Matrix(h * (config.qk_nope_head_dim + vd), c, 0.05f);
    if (config.mla_use_output_gate) w.g_proj = Matrix(h * vd, d, 0.05f);
    w.o_proj = Matrix(d, h * vd, 0.05f);
  }
};

int Main(int argc, char** argv) {
  std::string configs = "k3-tiny,k3-perf", contexts = "2048,8192,32768";
  int steps = 40;
  CLI::App app{"mla_bench: one MLA decode token over a long latent cache vs read bandwidth"};
  app.add_option("--configs", configs, "comma-separated named configs");
  app.add_option("--contexts", contexts, "comma-separated cached token counts");
  AddBoundedInt(&app, "--steps", &steps, 1, 1 << 20, "decode tokens timed per context (median)");
  if (std::optional<int> exit_status = ParseToolArgs(&app, {argv + 1, argv + argc})) {
    return *exit_status;
  }
  if (!HasLimitLoops()) {
    std::printf("mla_bench: needs AVX-512 with avx512_bf16 for the read-bandwidth loop; skipped\n");
    return 0;
  }
  std::printf("mla_bench: kernel pool %d threads\n", KernelThreadCount());
  const MachineLimits limits = MeasureMachineLimits();
  std::printf("%-8s %8s %6s %6s %14s %8s %8s %8s %8s\n", "config", "context", "heads", "width",
              "us/token/layer", "GB/s", "readBW", "GFLOP/s", "limit");
  for (absl::string_view name : absl::StrSplit(configs, ',')) {
    absl::StatusOr<ModelConfig> config = NamedConfig(std::string(name));
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 2;
    }
    RandomMla mla(*config);
    for (absl::string_view text : absl::StrSplit(contexts, ',')) {
      int64_t context = 0;
      if (!absl::SimpleAtoi(text, &context) || context < 1) {
        std::fprintf(stderr, "bad --contexts entry '%s'\n", std::string(text).c_str());
        return 2;
      }
      // The cache is filled directly with normalized-looking rows: what a prefill would leave,
      // without spending minutes on it.
      MlaCache cache(*config);
      cache.Reserve(context + steps + 1);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t i = 0; i < context * cache.width(); ++i) cache.rows[i] = normal(mla.rng);
      cache.length = context;
      const int64_t d = config->hidden_size;
      std::vector<float> x(d), out(d);
      for (float& v : x) v = normal(mla.rng);
      Scratch scratch;
      std::vector<double> times;
      for (int step = 0; step < steps; ++step) {
        const double start = NowSeconds();
        absl::Status status = MlaForwardBatch(*config, mla.w, x.data(), {{&cache, 1}}, out.data(),
                                              &scratch, MlaForm::kAbsorbed);
        times.push_back(NowSeconds() - start);
        if (!status.ok()) {
          std::fprintf(stderr, "%s\n", status.ToString().c_str());
          return 1;
        }
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double bytes = static_cast<double>(context) * cache.width() * sizeof(float);
      const double flops = 2.0 * context * config->num_attention_heads *
                           (cache.width() + config->kv_lora_rank);
      const double bound =
          std::max(bytes / (limits.read_gbs * 1e9), flops / (limits.fma_gflops * 1e9));
      std::printf("%-8s %8lld %6d %6lld %14.1f %8.1f %8.2f %8.1f %8.2f\n",
                  std::string(name).c_str(), static_cast<long long>(context),
                  config->num_attention_heads, static_cast<long long>(cache.width()),
                  median * 1e6, bytes / median / 1e9, bytes / median / 1e9 / limits.read_gbs,
                  flops / median / 1e9, bound / median);
    }
  }
  return 0;
}

}  // namespace
}  // namespace k3::bench

int main(int argc, char** argv) { return k3::bench::Main(argc, argv); }
