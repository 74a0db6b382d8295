// The router process: `k3serve router --coordinator HOST:PORT --model DIR [--port P]
//   [--metrics-port P] [--host H] [--step-timeout-ms 5000] [--qb-bins 100]`.
//
// It maps only the router tensors (WeightSelection::RouterOnly()), registers with the coordinator as
// ROLE_ROUTER, connects every attention and expert node of the cluster state on its UCX transport
// (PeerId = node id) and runs RouterCore (router/router_core.h) on one thread: MoeRequests in,
// ExpertRequests out to the placement's workers, MoeResponses back.
//
// gRPC (one port): k3serve.cluster.v1.RouterControl (GetLoadStats: tokens per expert and QB
// histograms per MoE layer, see router/router_load_stats.h; SetBias replaces a MoE layer's
// e_score_correction_bias, which changes the model's outputs (the coordinator's online bias, off
// by default); placements come from the coordinator's cluster state, taken up between steps, and
// each step's ExpertRequests carry the placement version it was planned with; the version in use
// goes to the coordinator with the heartbeats, at once when it changes) and
// grpc.health.v1: "" is SERVING while the process runs, "k3serve.cluster.v1.RouterControl" once a
// placement is in force and all its workers are connected. With --metrics-port, HTTP /metrics
// (RouterCore's metrics) and /healthz.
//
// The node is one actor (cluster/actor.h): its mailbox takes the data plane's polling, the
// cluster states and the RouterControl calls, so RouterCore is only ever used from that thread.
// Start-up, endpoints and shutdown are the node runtime's (cluster/node_runtime.h).
//
// SIGINT/SIGTERM: answers the steps in flight with UNAVAILABLE, leaves the cluster, closes the
// transport, exits 0. UCX_TLS / UCX_NET_DEVICES in the environment choose UCX's transports.
#ifndef K3SERVE_ROUTER_ROUTER_NODE_H_
#define K3SERVE_ROUTER_ROUTER_NODE_H_

#include "absl/time/time.h"
#include "cluster/command_line.h"

namespace k3 {

struct RouterNodeOptions {
  NodeFlags node;
  absl::Duration step_timeout = absl::Seconds(5);
  absl::Duration expert_retry_floor = absl::Milliseconds(300);
  int expert_retry_p99_factor = 8;
  int qb_bins = 100;
  bool per_expert_metrics = false;
};

// Declares the router's flags on `app`; parsing fills `options`.
void AddRouterNodeFlags(CLI::App* app, RouterNodeOptions* options);

// `k3serve router`: with those flags, runs the router node until SIGINT/SIGTERM; the exit status
// (0 clean, 1 failed).
Subcommand AddRouterNodeCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_ROUTER_ROUTER_NODE_H_
