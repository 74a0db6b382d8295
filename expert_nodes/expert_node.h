// The expert node process: `k3serve expert --coordinator HOST:PORT --model DIR --slots N
//   [--port P] [--metrics-port P] [--host H] [--drain-timeout-ms T] [--device cpu|cuda|cuda:N]`.
//
// --device cuda:N computes the experts on that GPU (expert_nodes/device_experts.h; MXFP4 experts,
// a build with the CUDA Toolkit; docs/GPU.md) instead of the CPU.
//
// It registers with the coordinator as ROLE_EXPERT offering N expert slots (experts per MoE layer),
// waits for a placement, maps ONLY the experts its worker slot hosts (WeightSelection::Experts of
// their union over the layers, so its memory scales with its slice), connects the routers of the
// cluster state and answers their ExpertRequests (expert_nodes/expert_worker.h) on one thread. A
// node the placement does not use yet is a spare: the coordinator hands it a dead node's slot, and
// it then loads that slot's experts; a node that joins a placed cluster becomes a worker through a
// rollout (below).
//
// Rebalancing (coordinator/coordinator_balancer.h): LoadExperts maps the experts of a placement version
// before the coordinator publishes it, and the node keeps serving older versions' requests with
// their experts (each ExpertRequest names the version it was planned with) until they retire:
// when a LoadExperts call says so (retire_below_version), and otherwise for all but the previous
// published version once a newer one is published.
//
// gRPC (one port): k3serve.cluster.v1.ExpertWorker (LoadExperts, Status: the newest version held)
// and grpc.health.v1, where "" is SERVING while the process runs (liveness) and
// "k3serve.cluster.v1.ExpertWorker" once its experts are loaded (readiness). With --metrics-port, HTTP /metrics and /healthz:
//   k3_expert_weight_bytes, k3_expert_resident_bytes, k3_expert_hosted_experts (summed over
//   layers), k3_expert_rows_total, k3_expert_requests_total{code}, k3_expert_request_seconds,
//   k3_expert_device_weight_bytes (with --device cuda).
//
// The node is one actor (cluster/actor.h): the data plane's turns, cluster states and the
// ExpertWorker RPCs are messages of its one mailbox, so the worker needs no lock. Start-up,
// endpoints and shutdown are the node runtime's (cluster/node_runtime.h).
//
// Draining (the elastic expert tier, coordinator/coordinator.h): on the coordinator's drain flag
// (its Drain RPC) the node keeps serving until the published placement has no worker slot for it
// (the coordinator moved its experts to other nodes: reserve, load, commit) and no request came
// for a second (routers switch between steps; steps planned before finish here on the old
// experts), then exits 0. SIGTERM on a node that holds a worker slot asks the coordinator to drain
// it and waits the same way, up to --drain-timeout-ms (default 60 s), unless no router is alive
// (the cluster is being stopped) or the coordinator cannot be reached.
//
// SIGINT/SIGTERM: (drains as above,) reports NOT_SERVING, leaves the cluster, closes the
// transport, exits 0.
// The data plane is UCX (cluster/ucx_transport.h); UCX_TLS / UCX_NET_DEVICES in the environment
// choose its transports and devices.
#ifndef K3SERVE_EXPERT_NODES_EXPERT_NODE_H_
#define K3SERVE_EXPERT_NODES_EXPERT_NODE_H_

#include "absl/time/time.h"
#include "cluster/command_line.h"
#include "expert_nodes/device_experts.h"

namespace k3 {

struct ExpertNodeOptions {
  NodeFlags node;
  int slots = 0;  // experts per MoE layer it can host, >= 1
  absl::Duration drain_timeout = absl::Seconds(60);  // on SIGTERM, for its experts to move
  ComputeDevice device;  // --device: where the experts are computed (CPU by default)
};

// Declares the expert node's flags on `app`; parsing fills `options`.
void AddExpertNodeFlags(CLI::App* app, ExpertNodeOptions* options);

// `k3serve expert`: with those flags, runs the expert node until SIGINT/SIGTERM; the exit status
// (0 clean, 1 failed).
Subcommand AddExpertNodeCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_EXPERT_NODE_H_
