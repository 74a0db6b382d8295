// `k3serve local`: a whole cluster on this host (launcher/local_cluster.h) from one command.
//
//   k3serve local --model DIR [--attention A] [--routers R] [--experts E] [--expert-slots 3,5,8]
//       [--base-port P] [--host H] [--no-metrics] [--log-dir DIR] [--startup-timeout-ms T]
//       [--stop-grace-ms T] [--http-port P] [--max-restarts N]
//       [--prompt 1,2,3 [--max-new-tokens N]]
//
// Starts the coordinator and A attention, R router and E expert processes (default 1 each;
// --expert-slots gives each expert node its share, default an even split), shows startup progress
// on stderr, and once the cluster is ready prints one line `generate address: HOST:PORT` per
// attention node on stdout, then `http address: HOST:PORT` for the OpenAI-compatible HTTP front
// (`k3serve http` in front of every attention node; --http-port, default a free port; -1: none),
// then `metrics address: NODE HOST:PORT` for every process's Prometheus /metrics (unless
// --no-metrics). Then it serves until SIGINT/SIGTERM and stops the tiers in order.
//
// While it serves it supervises the processes (launcher/restart_supervisor.h): one that exits is
// reported with its log tail on stderr and started again with the same flags and ports after a
// backoff (0.2 s doubling to 5 s; a run of 10 s resets it), logged as `k3serve local: restarting
// router-1 (exit: killed by signal 9), attempt 1 in 200 ms`. A process that fails more than
// --max-restarts times in a row (default 5; 0: no restarts) makes the launcher say so, stop the
// cluster and exit 1. An expert node that exits 0 was drained (SIGTERM or the coordinator's Drain
// RPC moved its experts to the others); it is restarted too and joins again. Expert nodes get
// spare slots holding replicas by default (--spare-expert-slots), so one that is killed costs no
// request and one sent SIGTERM can hand its experts over; a drain the others cannot absorb is
// refused and the node keeps serving.
//
// With --prompt it instead runs one greedy generation through the first attention node (without an HTTP front unless --http-port is given, nor metrics unless --metrics is),
// prints the new tokens (space-separated, like `k3serve generate`) and stops.
#ifndef K3SERVE_LAUNCHER_LOCAL_CLUSTER_MAIN_H_
#define K3SERVE_LAUNCHER_LOCAL_CLUSTER_MAIN_H_

#include <cstdint>
#include <vector>

#include "cluster/command_line.h"
#include "launcher/local_cluster.h"
#include "launcher/restart_supervisor.h"

namespace k3 {

struct LocalCommandOptions {
  LocalClusterOptions cluster;
  std::vector<int32_t> prompt;  // empty: serve until a signal
  int max_new_tokens = 16;
  RestartPolicy restart;  // while serving (not with --prompt)
};

// Declares `local`'s flags on `app`; parsing fills `options`.
void AddLocalFlags(CLI::App* app, LocalCommandOptions* options);

// Runs `k3serve local`; returns the exit status (0 after a clean stop or a successful --prompt
// run, 1 when the cluster failed to start, the generation failed or a process failed too often
// in a row, 130 when interrupted during startup).
int LocalClusterCommand(LocalCommandOptions options);

// `k3serve local`: AddLocalFlags and LocalClusterCommand as a subcommand of `top`.
Subcommand AddLocalCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_LAUNCHER_LOCAL_CLUSTER_MAIN_H_
