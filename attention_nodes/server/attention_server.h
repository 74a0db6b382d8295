// The attention node: `k3serve attention --coordinator HOST:PORT --model DIR [--port P]
//   [--metrics-port P] [--host H] [--max-batch-tokens N] [--max-sequences N]
//   [--max-new-tokens-limit N] [--max-prompt-tokens N] [--moe-timeout-ms T] [--drain-timeout-ms T]
//   [--tls-cert F --tls-key F [--tls-ca F]] [--auth-token-file F] [--max-request-bytes N]
//   [--max-streams-per-client N]`.
//
// Security (README "Security"): the TLS flags secure its gRPC port (mutual TLS with --tls-ca)
// and its calls to the coordinator; --auth-token-file makes K3Serve calls without the bearer
// token UNAUTHENTICATED (health checks stay open); a request message above --max-request-bytes
// is refused RESOURCE_EXHAUSTED by gRPC, and so is a Generate call beyond
// --max-streams-per-client streams in flight from one client address.
//
// It maps everything but the routed experts and the router tensors (WeightSelection::
// AttentionOnly()), owns every request's KV/KDA state, and serves the public API,
// k3serve.v1.K3Serve (attention_nodes/server/attention_service.h), plus AttentionControl.Drain and
// grpc.health.v1 on one gRPC port. Requests are batched continuously by a GenerationScheduler;
// each MoE layer's rows go over the UCX transport to a router (RemoteRoutedMoe: round-robin over
// the connected routers).
//
// Membership: registers as ROLE_ATTENTION with its transport address (routers connect back to it)
// and connects every ALIVE router of the cluster state (PeerLinks, PeerId = node id).
// Health: "" is SERVING while the process runs; "k3serve.v1.K3Serve" is SERVING while the
// coordinator says the cluster is ready, at least one router is connected and the node is not
// draining.
//
// Draining (AttentionControl.Drain, the coordinator's drain flag, SIGTERM): new Generate calls
// get UNAVAILABLE and readiness turns NOT_SERVING; requests in flight continue. SIGINT/SIGTERM
// then waits up to --drain-timeout-ms for them, cancels the rest (UNAVAILABLE), leaves the cluster
// and exits 0.
//
// Thread-safety: the AttentionServer methods may be called from any thread; Shutdown and the
// destructor from one.
#ifndef K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVER_H_
#define K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "base/compute_device.h"
#include "cluster/command_line.h"
#include "model/weights.h"
#include "proto/cluster.pb.h"
#include "moe/routed_moe.h"

namespace k3 {

struct AttentionServerOptions {
  NodeFlags node;  // coordinator and model are ignored by StartStandalone
  SchedulerOptions scheduler;
  absl::Duration moe_timeout = absl::Seconds(30);    // RemoteRoutedMoeOptions::timeout
  // RemoteRoutedMoeOptions::retry_floor and retry_p99_factor: the step deadline after which a MoE
  // layer goes to another router.
  absl::Duration moe_retry_floor = absl::Milliseconds(500);
  int moe_retry_p99_factor = 8;
  absl::Duration drain_timeout = absl::Seconds(30);  // at shutdown, for requests in flight
  std::string auth_token_file;               // empty: no token required
  int max_request_bytes = 4 << 20;           // gRPC max receive message size
  int max_streams_per_client = 128;          // 0: no limit
  // Where the forward pass runs (--device): the CPU, or a CUDA device with the sequences' states
  // in its memory (attention_nodes/server/device_step_runner.h).
  ComputeDevice device;
  int64_t gpu_cache_pages = 0;  // MLA cache pages of 64 tokens on the GPU; 0: the most requests
                                // could use (--max-sequences x their longest context)
};

// Declares the attention node's flags on `app`; parsing fills `options`.
void AddAttentionFlags(CLI::App* app, AttentionServerOptions* options);
// The part of them that is about serving Generate, not about the cluster (no node flags, no MoE
// timeouts): the scheduler, the limits, drain, bearer token, --device. `k3serve serve` (which
// holds every tier) declares these too.
void AddGenerateServingFlags(CLI::App* app, AttentionServerOptions* options);

// Serves until SIGINT/SIGTERM (draining first); the exit status (0 clean, 1 failed).
int RunAttentionNode(const AttentionServerOptions& options);

// `k3serve attention`: AddAttentionFlags and RunAttentionNode as a subcommand of `top`.
Subcommand AddAttentionCommand(CLI::App* top);

class AttentionServer {
 public:
  // The cluster node described above: loads the weights, creates the transport, starts serving
  // and registers with the coordinator (in the background; readiness follows).
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Start(
      const AttentionServerOptions& options);

  // A node outside any cluster whose routed experts are `routed_moe` (in process, or a test's
  // fake): no coordinator, no transport, ready at once. `options.coordinator` and
  // `options.model` are ignored. `weights` and `routed_moe` must outlive the server.
  static absl::StatusOr<std::unique_ptr<AttentionServer>> StartStandalone(
      const AttentionServerOptions& options, const ModelWeights* weights, RoutedMoe* routed_moe);

  // Shutdown().
  ~AttentionServer();

  AttentionServer(const AttentionServer&) = delete;
  AttentionServer& operator=(const AttentionServer&) = delete;

  int port() const;
  int metrics_port() const;  // -1 without a metrics endpoint
  // A channel to this server's gRPC services from inside the process (no socket; the bearer
  // token is still required): a front in the same process (`k3serve serve`) calls Generate on it.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Stops admitting (readiness NOT_SERVING); once the requests in flight end, or at `deadline`
  // after cancelling what is left with UNAVAILABLE, calls `done` with how many were left. Returns
  // at once; `done` runs on the scheduler's thread and must not block.
  void DrainAsync(absl::Time deadline, std::function<void(int left)> done);
  // DrainAsync, waited for (the caller's thread blocks: not for actors or gRPC handlers).
  int Drain(absl::Time deadline);

  // Drain(now + drain_timeout), stops the scheduler, leaves the cluster, stops serving.
  // Idempotent.
  void Shutdown();

 private:
  struct Parts;
  explicit AttentionServer(std::unique_ptr<Parts> parts);
  // Creates the scheduler, the services, the gRPC server and the metrics endpoint.
  // Starts the endpoints; `role` ROLE_UNSPECIFIED for a standalone server (no registration).
  absl::Status StartServing(const ModelWeights* weights, RoutedMoe* routed_moe,
                            k3serve::cluster::v1::Role role);
  // The cluster watcher's look at membership, router links and readiness; runs on the watcher
  // every 200 ms and whenever the cluster state changes.
  void Tick();
  void ScheduleTick();

  std::unique_ptr<Parts> parts_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVER_H_
