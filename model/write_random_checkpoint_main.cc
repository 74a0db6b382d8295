// Writes a random checkpoint of a named config (spec §12) or of a config.json, for tests and
// benchmarks:
//   write_random_checkpoint --config=k3-perf --out=/tmp/k3-perf [--seed=1] [--shards=4]
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

ABSL_FLAG(std::string, config, "k3-tiny",
          "named config (k3-tiny, k3-tiny-8, kimi-linear-tiny, k3-perf) or a config.json path");
ABSL_FLAG(std::string, out, "", "output directory");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int, shards, 1, "number of safetensors shards");
ABSL_FLAG(double, linear_std, 0.02, "standard deviation of linear weights");
ABSL_FLAG(std::string, dtype, "BF16", "BF16, F16 or F32");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "--out is required\n");
    return 2;
  }
  const std::string name = absl::GetFlag(FLAGS_config);
  auto config = k3::NamedConfig(name);
  if (!config.ok()) config = k3::LoadModelConfig(name);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto dtype = k3::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "%s\n", dtype.status().ToString().c_str());
    return 2;
  }
  k3::RandomCheckpointOptions options;
  options.shards = absl::GetFlag(FLAGS_shards);
  options.linear_std = static_cast<float>(absl::GetFlag(FLAGS_linear_std));
  options.dtype = *dtype;
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = k3::WriteRandomCheckpoint(*config, absl::GetFlag(FLAGS_seed), out, options);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s to %s in %.1f s\n", name.c_str(), out.c_str(), seconds);
  return 0;
}
