#include "bench/cluster_bench_setup.h"

#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/work_dir.h"

namespace k3 {

void AddClusterBenchFlags(CLI::App* app, ClusterBenchFlags* flags) {
  AddBoundedInt(app, "--attention", &flags->attention, 1, 64, "attention workers");
  AddBoundedInt(app, "--routers", &flags->routers, 1, 64, "routers");
  AddBoundedInt(app, "--experts", &flags->experts, 1, 256, "expert workers");
  AddBoundedInt(app, "--node-threads", &flags->node_threads, 0, 4096,
                "kernel threads of each cluster node (K3SERVE_THREADS; 0: the cores split "
                "among them)");
  AddBoundedInt(app, "--busy-poll-us", &flags->busy_poll_us, -1, 1000 * 1000,
                "every data-plane node's --busy-poll-us (-1: the nodes' default)");
  app->add_option("--k3serve", flags->k3serve, "the k3serve binary");
  app->add_option("--work-dir", flags->work_dir,
                  "checkpoints and logs (default: a new folder, removed after a run that "
                  "succeeds)");
}

LocalClusterOptions ClusterBenchOptions(const ClusterBenchFlags& flags, const std::string& model,
                                        const std::string& log_dir,
                                        std::vector<std::string> attention_args) {
  LocalClusterOptions options;
  options.binary = flags.k3serve;
  options.model = model;
  options.attention = flags.attention;
  options.routers = flags.routers;
  options.experts = flags.experts;
  options.log_dir = log_dir;
  options.startup_timeout = absl::Minutes(5);
  options.node_threads = flags.node_threads;
  options.metrics = true;  // the step breakdown
  options.extra_args[NodeRole::kAttention] = std::move(attention_args);
  if (flags.busy_poll_us >= 0) {
    for (NodeRole role : {NodeRole::kAttention, NodeRole::kRouter, NodeRole::kExpert}) {
      options.extra_args[role].push_back(absl::StrCat("--busy-poll-us=", flags.busy_poll_us));
    }
  }
  return options;
}

int RunClusterBench(CLI::App* app, const std::vector<std::string>& args,
                    std::string_view work_dir_prefix, ClusterBenchFlags* flags,
                    const std::function<absl::Status()>& bench) {
  if (std::optional<int> exit_status = ParseToolArgs(app, args)) return *exit_status;
  flags->k3serve = std::filesystem::absolute(flags->k3serve).string();
  const bool own_work_dir = flags->work_dir.empty();
  if (own_work_dir) {
    absl::StatusOr<std::string> made = MakeBenchWorkDir(work_dir_prefix);
    if (!made.ok()) {
      std::cerr << made.status() << "\n";
      return 1;
    }
    flags->work_dir = *made;
  }
  if (absl::Status status = bench(); !status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  if (own_work_dir) std::filesystem::remove_all(flags->work_dir);
  return 0;
}

}  // namespace k3
