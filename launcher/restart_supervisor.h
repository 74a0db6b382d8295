// RestartSupervisor: when and whether `k3serve local` restarts a child process that died, as a
// Kubernetes controller would (launcher/local_cluster_main.h runs it).
//
// Each node that exits is restarted after a backoff that starts at `initial_backoff` and doubles
// with every failure in a row, up to `max_backoff`. A run of at least `healthy_run` resets the
// count: the next death is attempt 1 again. A node that failed `max_failures_in_a_row` times in a
// row (no healthy run in between) is not restarted once more: Exited says to give up.
//
// Pure bookkeeping: the caller reports starts and exits with the time, asks which restarts are
// due, and does the restarting (LocalCluster::Restart). Time is an argument, so tests drive it.
// Thread-compatible (the launcher's main thread owns it).
#ifndef K3SERVE_LAUNCHER_RESTART_SUPERVISOR_H_
#define K3SERVE_LAUNCHER_RESTART_SUPERVISOR_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace k3 {

struct RestartPolicy {
  // Restarts in a row without a healthy run (one that lasts healthy_run) before giving up; 0:
  // never restart.
  int max_failures_in_a_row = 5;
  absl::Duration healthy_run = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);

  // INVALID_ARGUMENT naming the field for negative values or max_backoff < initial_backoff.
  absl::Status Validate() const;
};

// How a process ended, from its LocalCluster::Node::exit_status (the exit code, or 128 + signal):
// "killed by signal 9", "exit status 1".
std::string DescribeExitStatus(int exit_status);

class RestartSupervisor {
 public:
  struct Decision {
    bool give_up = false;  // true: failed too often in a row; do not restart
    int attempt = 0;       // 1 for the first restart after a healthy run (or the first start)
    absl::Duration delay;  // until the restart (also in `due`)
    absl::Time due;
    // For the launcher's output: "restarting router-1 (exit: killed by signal 9), attempt 2 in
    // 400 ms", or why it gives up.
    std::string message;
  };

  // REQUIRES: policy.Validate().ok().
  explicit RestartSupervisor(const RestartPolicy& policy) : policy_(policy) {}

  // `node` (re)started at `now`.
  void Started(const std::string& node, absl::Time now);
  // `node` exited at `now` with `exit_status`; schedules its restart unless the decision is to
  // give up.
  Decision Exited(const std::string& node, int exit_status, absl::Time now);
  // The nodes whose restart is due at `now`, in name order; each is returned once.
  std::vector<std::string> TakeDue(absl::Time now);
  // The earliest scheduled restart; InfiniteFuture when none is.
  absl::Time NextDue() const;

 private:
  struct NodeState {
    absl::Time started = absl::InfinitePast();
    int failures_in_a_row = 0;
    absl::Time restart_at = absl::InfiniteFuture();  // InfiniteFuture: none scheduled
  };

  const RestartPolicy policy_;
  std::map<std::string, NodeState> nodes_;
};

}  // namespace k3

#endif  // K3SERVE_LAUNCHER_RESTART_SUPERVISOR_H_
