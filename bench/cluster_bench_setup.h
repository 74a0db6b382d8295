// What the benches that start a local cluster (cluster_bench, load_bench) share: the cluster's
// shape and the nodes' tuning on the command line, the LocalClusterOptions made of them, and a
// main that runs the bench in a scratch folder of its own.
#ifndef K3SERVE_BENCH_CLUSTER_BENCH_SETUP_H_
#define K3SERVE_BENCH_CLUSTER_BENCH_SETUP_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "cluster/command_line.h"
#include "launcher/local_cluster.h"

namespace k3 {

struct ClusterBenchFlags {
  int attention = 1, routers = 1, experts = 2;  // nodes of each kind
  int node_threads = 0;   // LocalClusterOptions::node_threads (0: the cores split between nodes)
  int busy_poll_us = -1;  // every data-plane node's --busy-poll-us (-1: theirs)
  std::string k3serve = "k3serve";  // the binary; RunClusterBench makes the path absolute
  std::string work_dir;             // checkpoints and logs (empty: a new folder)
};

// --attention, --routers, --experts, --node-threads, --busy-poll-us, --k3serve and --work-dir.
void AddClusterBenchFlags(CLI::App* app, ClusterBenchFlags* flags);

// The cluster the flags describe, of the checkpoint in `model`, logging to `log_dir`, with
// metrics on (for the step breakdown) and 5 minutes to start; the attention nodes get
// `attention_args`, then every data-plane node the --busy-poll-us flag if set.
LocalClusterOptions ClusterBenchOptions(const ClusterBenchFlags& flags, const std::string& model,
                                        const std::string& log_dir,
                                        std::vector<std::string> attention_args);

// A bench's main: parses `args` into `app` (flags included), makes flags->k3serve absolute (under
// `bazel run` the data dependency //:k3serve lies in the runfiles folder we start in), gives
// flags->work_dir a new folder $TMPDIR/<work_dir_prefix>-XXXXXX unless one was given, and runs
// `bench`. Its own folder is removed when the bench succeeds, and kept (with the nodes' logs)
// when it fails. Returns the exit status: 0, 2 on bad flags (0 for --help), 1 when the bench
// fails (the error printed to stderr).
int RunClusterBench(CLI::App* app, const std::vector<std::string>& args,
                    std::string_view work_dir_prefix, ClusterBenchFlags* flags,
                    const std::function<absl::Status()>& bench);

}  // namespace k3

#endif  // K3SERVE_BENCH_CLUSTER_BENCH_SETUP_H_
