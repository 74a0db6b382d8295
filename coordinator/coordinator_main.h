// The coordinator process: `k3serve coordinator ...` parses its arguments with
// ParseCoordinatorArgs and calls RunCoordinator.
//
// The process serves k3serve.cluster.v1.Coordinator and grpc.health.v1 on one gRPC port (health
// "" and "k3serve.cluster.v1.Coordinator" are SERVING while it runs: the coordinator is ready to
// take registrations as soon as it is up; cluster readiness is GetClusterState's `ready` and the
// k3_coordinator_ready metric), and /metrics and /healthz over HTTP when a metrics port is given.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_MAIN_H_
#define K3SERVE_COORDINATOR_COORDINATOR_MAIN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/command_line.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_balancer.h"

namespace k3 {

struct CoordinatorMainOptions {
  // --host, --port (gRPC; 0 picks a free port, see CoordinatorProcess::port()) and
  // --metrics-port (HTTP /metrics and /healthz); coordinator and model are unused.
  NodeFlags node;
  CoordinatorOptions coordinator;
  LoadBalancerOptions balancing;
  absl::Duration shutdown_grace = absl::Seconds(2);  // for RPCs in flight at shutdown
};

// Parses the arguments after `coordinator` (`--flag=value` or `--flag value`):
//   --port P                  gRPC port (default 0: any)
//   --host H                  listen address (default 0.0.0.0)
//   --metrics-port P          HTTP metrics port (default: none)
//   --model M                 a config name (k3-tiny, ...) or a config.json / checkpoint folder:
//                             sets the expert count and the number of MoE layers
//   --num-experts N           routed experts per MoE layer (overrides --model)
//   --num-moe-layers L        layers with routed experts (overrides --model)
//   --expected-experts E      expert nodes the initial placement waits for (default 1)
//   --required-roles R,...    roles that must be alive for readiness, from attention, router,
//                             expert (default: all three; without experts: attention,router)
//   --heartbeat-interval-ms, --heartbeat-timeout-ms, --recovery-window-ms
//   --shutdown-grace-ms
// Expert load (coordinator/coordinator_balancer.h):
//   --load-stats-interval-ms T  gather the routers' expert load every T ms (default 5000; 0: only
//                             for GetLoadReport refreshes, rebalancing and bias pushes)
//   --rebalance-interval-ms T   re-plan the expert placement from the load every T ms and roll it
//                             out when worth it (default 0: only on a Rebalance RPC)
//   --spare-slots-per-worker S  experts per MoE layer a worker may hold beyond its share: the
//                             initial placement fills them with replicas of the next workers'
//                             experts (failover, coordinator.h), a rebalance with replicas of hot
//                             experts (default 0); when too few expert nodes are left for their
//                             declared slots, they hold shares instead
//   --rebalance-min-improvement F  roll out only when the mean worker MaxVio drops by this
//                             fraction of its value (default 0.1)
//   --retire-delay-ms T         after the routers switched, how long the expert nodes keep the
//                             old placement's experts (default 5000)
//   --online-bias-interval-ms T  push the routers' QB bias estimate every T ms (default 0: off).
//                             This CHANGES THE MODEL'S OUTPUTS: the bias selects the experts.
// The expert tier is elastic (coordinator.h, no flag): joining expert nodes get experts, drained
// ones (the Drain RPC, an expert node's SIGTERM) hand theirs over, and experts whose last host died
// move onto the survivors, each rolled out load-then-publish like a rebalance.
// INVALID_ARGUMENT naming the flag for unknown flags, malformed values or inconsistent options.
// Declares the coordinator's flags on `app`; parsing fills `options` (the model's expert counts
// and the required roles are resolved once parsing ends).
void AddCoordinatorFlags(CLI::App* app, CoordinatorMainOptions* options);

absl::StatusOr<CoordinatorMainOptions> ParseCoordinatorArgs(const std::vector<std::string>& args);

// A running coordinator: gRPC server, service and optional metrics endpoint.
// Thread-safety: port accessors from any thread; Shutdown from one.
class CoordinatorProcess {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const CoordinatorMainOptions& options);
  // Shutdown().
  ~CoordinatorProcess();

  int port() const;
  int metrics_port() const;  // -1 without a metrics endpoint

  // Reports NOT_SERVING, finishes calls in flight (up to the grace), stops. Idempotent.
  void Shutdown();

 private:
  struct Parts;
  explicit CoordinatorProcess(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

// Starts the coordinator and serves until SIGINT or SIGTERM. Returns the process exit code
// (0 after a clean shutdown, 1 when it could not start).
int RunCoordinator(const CoordinatorMainOptions& options);

// `k3serve coordinator`: AddCoordinatorFlags and RunCoordinator as a subcommand of `top`.
Subcommand AddCoordinatorCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_MAIN_H_
