// LocalCluster: a real k3serve cluster of separate processes on this host, started from one
// k3serve binary's subcommands: the coordinator first, then the expert, router and attention
// nodes. Backs `k3serve local` (launcher/local_cluster_main.h), the multi-process tests and the
// cluster benchmark.
//
// Each node runs as `BINARY <role> --coordinator HOST:PORT --model DIR --host H --port P ...`
// with stdout and stderr in LOG_DIR/<node>.log. A child dies with the thread that started it
// (PR_SET_PDEATHSIG, SIGKILL), so even a crashed or SIGKILLed launcher leaves no orphans; start and
// restart nodes from one long-lived thread. Children run in their own process group (a terminal's
// Ctrl-C reaches only the launcher, which then stops the tiers in order) with the signal mask
// cleared.
//
// Ports: with base_port P the coordinator listens on P, attention node i on P+1+i, then routers,
// then experts (metrics ports, if asked for, follow the last gRPC port in the same order); with
// base_port 0 the launcher picks free ports.
//
// A node can run in another network namespace (NodeSite::netns, a name under /run/netns as
// `ip netns add` creates), which is how tests put tiers on separate "hosts" joined by veth pairs.
//
// Thread-safety: not thread-safe; one thread owns a LocalCluster.
#ifndef K3SERVE_LAUNCHER_LOCAL_CLUSTER_H_
#define K3SERVE_LAUNCHER_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/command_line.h"
#include "cluster/security.h"
#include "launcher/cluster_plan.h"
#include "proto/cluster.pb.h"

namespace k3 {

class LocalCluster {
 public:
  struct Node {
    std::string name;  // "coordinator", "attention-0", "router-1", "expert-2", ...
    NodeRole role;
    int index = 0;  // within its role
    std::vector<std::string> argv;
    std::string grpc_address;     // host:port
    std::string metrics_address;  // host:port, empty without metrics
    std::string http_address;     // host:port of the HTTP front's API; empty for other roles
    std::string log_path;
    pid_t pid = -1;       // -1 once it was reaped
    int exit_status = 0;  // once reaped: the exit code, or 128 + signal
    int port_relaunches = 0;  // times started again on fresh ports (RelaunchOnTakenPort)
  };

  // Validates the options, starts every node and waits (up to startup_timeout) until the
  // coordinator reports the cluster ready and every node's readiness health service is SERVING
  // (attention "k3serve.v1.K3Serve", router "k3serve.cluster.v1.RouterControl", expert
  // "k3serve.cluster.v1.ExpertWorker"), so that the first request finds every tier in place. If a
  // node exits or the deadline passes first, everything is stopped and the error names the node (or
  // what the cluster still waited for) with the tail of its log. INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);

  // Stop().
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const std::vector<Node>& nodes() const { return nodes_; }
  // The node called `name`; NOT_FOUND otherwise.
  absl::StatusOr<const Node*> node(const std::string& name) const;
  const std::string& coordinator_address() const { return nodes_[0].grpc_address; }
  // The attention nodes' gRPC addresses, where clients call k3serve.v1.K3Serve.
  std::vector<std::string> generate_addresses() const;
  // The HTTP front's API address (http://ADDRESS/v1/...); empty without a front.
  std::string http_address() const;
  // The HTTP front's gRPC address, where it serves k3serve.v1.K3Serve forwarded to the attention
  // nodes (balanced, prefix-aware: http_front/grpc_proxy.h); empty without a front.
  std::string front_grpc_address() const;
  const std::string& log_dir() const { return log_dir_; }

  // Sends `signal` to the node. FAILED_PRECONDITION when it is not running.
  absl::Status Signal(const std::string& name, int signal);
  // Waits until the node exits and returns its exit status (128 + signal when killed);
  // DEADLINE_EXCEEDED if it still runs after `timeout`.
  absl::StatusOr<int> WaitExit(const std::string& name, absl::Duration timeout);
  // Starts a node that exited again with the same flags (same ports).
  absl::Status Restart(const std::string& name);
  // Starts one more expert node ("expert-N", N the next index) with `slots` expert slots and the
  // first expert node's other flags on free ports, and returns its name: it joins the running
  // cluster (the coordinator makes it a worker, coordinator/coordinator.h). FAILED_PRECONDITION
  // without an expert node to copy the flags of.
  absl::StatusOr<std::string> AddExpertNode(int slots);

  // Reaps nodes that exited (without blocking) and returns those that did since the last call.
  std::vector<const Node*> Reap();
  // Reap(), then an error naming the first node that is not running, with its exit status and
  // log tail.
  absl::Status CheckRunning();
  // Waits until the coordinator says ready and every node is SERVING, as Start does.
  absl::Status WaitReady(absl::Time deadline);
  absl::StatusOr<k3serve::cluster::v1::ClusterState> GetClusterState(absl::Duration timeout) const;

  // Stops the tiers in order (attention, routers, experts, coordinator): SIGTERM, then SIGKILL
  // after stop_grace. OK when every node had exited or exited 0 on SIGTERM; otherwise an error
  // listing the nodes that needed SIGKILL or exited with another status. Idempotent.
  absl::Status Stop();

  // The last `lines` lines of a log file ("" if unreadable).
  static std::string LogTail(const std::string& path, int lines = 20);

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}

  // Checks the options, resolves what the plan needs (paths, the model's experts, ports, the log
  // folder) and fills nodes_ from PlanCluster (cluster_plan.h).
  absl::Status Plan();
  // The binary's real path, the model's absolute path and its expert count; INVALID_ARGUMENT when
  // either is unusable.
  absl::Status ResolvePaths(ClusterPlanInputs* in) const;
  // log_dir_: options_.log_dir (created if needed) or a new folder under $TMPDIR.
  absl::Status MakeLogDir();
  absl::Status Launch(Node& node);
  absl::Status WaitCoordinatorUp(absl::Time deadline);
  // Reaps `node` if it exited (without blocking); true if it just did.
  bool Poll(Node& node);
  absl::Status ExitedError(const Node& node) const;
  // While Start runs, with ports the launcher picked: when `node` exited and one of its listening
  // ports is now held by another socket (a port taken between picking and binding, e.g. by
  // another launcher on a busy machine), picks fresh ports for it, starts it again (and an HTTP
  // front that names its address) and returns true; at most kMaxPortRelaunches times per node.
  // False otherwise: the node failed for a reason of its own.
  bool RelaunchOnTakenPort(Node& node);
  absl::StatusOr<std::vector<int>> PickPorts(int n) const;  // options_.pick_ports or free ones
  static constexpr int kMaxPortRelaunches = 3;
  void Progress(const std::string& line) const;
  Node* Find(const std::string& name);

  const LocalClusterOptions options_;
  ClientTls tls_;  // options_.tls as the launcher's client credentials
  std::string log_dir_;
  std::vector<Node> nodes_;  // coordinator first, then attention, routers, experts
  bool stopped_ = false;
  bool starting_ = false;  // inside Start
  int node_threads_ = 1;       // K3SERVE_THREADS given to routers and experts (Plan)
  int attention_threads_ = 1;  // and to attention nodes
};

}  // namespace k3

#endif  // K3SERVE_LAUNCHER_LOCAL_CLUSTER_H_
