// The node runtime every role's process runs on: the public endpoints (gRPC with grpc.health.v1,
// HTTP /metrics), registration with the coordinator, and the process life cycle (start, serve
// until SIGINT/SIGTERM or a fatal error, drain, shut down).
//
// A role (attention worker, router, expert worker, coordinator) supplies its hooks as a RoleHooks
// and its services to NodeEndpoints; nothing else about starting or stopping a node is written per
// role.
#ifndef K3SERVE_CLUSTER_NODE_RUNTIME_H_
#define K3SERVE_CLUSTER_NODE_RUNTIME_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "cluster/command_line.h"
#include "cluster/coordinator_client.h"
#include "cluster/grpc_server.h"
#include "cluster/metrics.h"
#include "cluster/security.h"
#include "proto/cluster.pb.h"

namespace k3 {

// A role's hooks. RunNode calls Start once, Failure between its waits, and Shutdown once (also
// after a failed Start, so Shutdown must cope with a partial start). The constructor must not
// start threads: RunNode blocks the stop signals first, and threads inherit the mask.
class RoleHooks {
 public:
  virtual ~RoleHooks() = default;
  virtual absl::Status Start() = 0;
  // Non-OK once the role can no longer serve and the process should exit with an error.
  // Called from RunNode's thread; implementations make it thread-safe.
  virtual absl::Status Failure() { return absl::OkStatus(); }
  // True once the role has finished its work and the process should exit 0 as after a signal
  // (e.g. an expert node drained by the coordinator). Called like Failure.
  virtual bool Finished() { return false; }
  // Asked on SIGINT/SIGTERM before RunNode stops the role: non-OK refuses the stop (logged with
  // its reason) and the role keeps serving, e.g. an expert node whose drain the coordinator
  // cannot honour, which would leave with the only copy of its experts. A later signal asks again.
  virtual absl::Status AcceptStop() { return absl::OkStatus(); }
  // Drains what is in flight (within the role's own deadline) and releases everything.
  virtual void Shutdown() = 0;
};

// Runs `role` as this process until SIGINT/SIGTERM that AcceptStop() accepts, Failure() or
// Finished(). Returns the exit
// status: 0 after a signal or once finished, 1 when it could not start or failed. `name`
// prefixes the log lines ("router node").
int RunNode(const std::string& name, std::unique_ptr<RoleHooks> role);

// RunNode for a role whose whole process is one object: `Process::Start(options)` returns it
// (StatusOr<unique_ptr<Process>>) and `Shutdown()` drains and stops it. `started`, when given,
// is called once with it after a successful start (e.g. to print the address a launcher reads).
template <typename Process, typename Options>
int RunProcessNode(const std::string& name, const Options& options,
                   std::function<void(Process&)> started = nullptr) {
  class Hooks final : public RoleHooks {
   public:
    Hooks(const Options& options, std::function<void(Process&)> started)
        : options_(options), started_(std::move(started)) {}
    absl::Status Start() override {
      K3_ASSIGN_OR_RETURN(std::unique_ptr<Process> process, Process::Start(options_));
      process_ = std::move(process);
      if (started_) started_(*process_);
      return absl::OkStatus();
    }
    void Shutdown() override {
      if (process_) process_->Shutdown();
    }

   private:
    const Options options_;
    const std::function<void(Process&)> started_;
    std::unique_ptr<Process> process_;
  };
  return RunNode(name, std::make_unique<Hooks>(options, std::move(started)));
}

// The k3serve subcommand of a role whose RoleHooks are a `Role` built from the options its flags
// (`add_flags`) fill: RunNode runs it, its log lines prefixed "`name` node".
template <typename Role, typename Options>
Subcommand AddNodeSubcommand(CLI::App* top, const std::string& name, const std::string& help,
                             void (*add_flags)(CLI::App*, Options*)) {
  return AddSubcommand(top, name, help, add_flags, [name](const Options& options) {
    return RunNode(name + " node", std::make_unique<Role>(options));
  });
}

struct NodeEndpointsOptions {
  NodeFlags flags;
  // The role registered with the coordinator; ROLE_UNSPECIFIED for a node outside any cluster
  // (no registration: Register must not be called).
  k3serve::cluster::v1::Role role = k3serve::cluster::v1::ROLE_UNSPECIFIED;
  // The health service that SetReady turns SERVING; "" (overall liveness) is SERVING from the
  // start.
  std::string readiness_service;
  std::vector<grpc::Service*> services;  // not owned; must outlive the endpoints
  // The readiness /healthz reports on the metrics port; null: the readiness service's state.
  std::function<absl::Status()> readiness;
  absl::Duration shutdown_grace = absl::Seconds(1);  // for RPCs in flight at Stop
  // GrpcServerOptions::max_receive_message_bytes (0: gRPC's default).
  int max_receive_message_bytes = 0;
};

// The gRPC server, the optional metrics endpoint and the coordinator client of one node.
// TLS (flags.tls, cluster/security.h): the gRPC server serves it and the coordinator client and
// client_tls() dial with it; the metrics endpoint stays plain HTTP.
// Thread-safe; Stop from one thread.
class NodeEndpoints {
 public:
  // INVALID_ARGUMENT naming the flag and file for unusable TLS flags; UNAVAILABLE when the
  // gRPC or metrics port cannot be bound.
  static absl::StatusOr<std::unique_ptr<NodeEndpoints>> Start(NodeEndpointsOptions options);
  ~NodeEndpoints();  // Stop()

  // Registers with the coordinator at options.flags.coordinator as `node` (role, addresses and
  // metrics address are filled in here; the role adds what is its own, e.g. the transport
  // address) and reports cluster state changes to `callbacks` from the client's thread. Call it
  // once, when everything the callbacks touch exists.
  // `take_broken_device_channels`: CoordinatorClientOptions' (a node with device channels).
  void Register(k3serve::cluster::v1::NodeInfo node, CoordinatorCallbacks callbacks,
                std::function<std::vector<uint64_t>()> take_broken_device_channels = nullptr);

  // Readiness (options.readiness_service and the metrics /healthz when no readiness was given).
  void SetReady(bool ready);
  bool ready() const;

  int port() const { return server_->port(); }
  int metrics_port() const { return http_ ? http_->port() : -1; }
  const std::string& grpc_address() const { return grpc_address_; }  // advertised host:port
  // GrpcServer::InProcessChannel: the node's own services, called from inside the process.
  std::shared_ptr<grpc::Channel> InProcessChannel() { return server_->InProcessChannel(); }
  // Null before Register.
  CoordinatorClient* client() const { return client_.get(); }
  // How this node dials other nodes of the cluster (the TLS flags as client credentials).
  const ClientTls& client_tls() const { return client_tls_; }

  // Leaves the cluster (the coordinator client stops, so peers stop sending here); the servers
  // keep answering until Stop.
  void Leave();
  // Leave, then stops the metrics endpoint and the gRPC server (1 s grace). Idempotent.
  void Stop();

 private:
  explicit NodeEndpoints(NodeEndpointsOptions options) : options_(std::move(options)) {}

  const NodeEndpointsOptions options_;
  std::string advertised_host_;  // how other processes reach this one
  std::string grpc_address_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopped_{false};
  ClientTls client_tls_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsHttpServer> http_;
  std::unique_ptr<CoordinatorClient> client_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NODE_RUNTIME_H_
