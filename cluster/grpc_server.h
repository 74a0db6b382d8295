// GrpcServer: a started gRPC server with the standard health service (grpc.health.v1.Health) on
// one bound port, plus CheckServing, the client side of the same health protocol.
//
// Health: the overall status (service name "") and every name in `health_services` start
// NOT_SERVING; the owner flips them with SetServing. Convention in k3serve: "" turns SERVING once
// the process answers its control RPCs (liveness); a service's full name, e.g.
// "k3serve.v1.K3Serve", turns SERVING once it can do its work (readiness), and back to
// NOT_SERVING while draining. Shutdown reports everything NOT_SERVING before closing.
//
// Thread-safety: all methods may be called from any thread.
#ifndef K3SERVE_CLUSTER_GRPC_SERVER_H_
#define K3SERVE_CLUSTER_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"

namespace k3 {

struct GrpcServerOptions {
  // host:port to listen on; port 0 picks a free one (see GrpcServer::port()).
  std::string address = "0.0.0.0:0";
  // Service names the health service reports besides "".
  std::vector<std::string> health_services;
  // Null: plaintext (cluster/security.h makes TLS credentials).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // The largest request message accepted (RESOURCE_EXHAUSTED beyond); 0: gRPC's default (4 MiB).
  int max_receive_message_bytes = 0;
};

class GrpcServer {
 public:
  // Builds and starts the server. `services` are not owned and must outlive the server.
  // UNAVAILABLE when the address cannot be bound or the TLS certificate and key are not usable
  // together, INVALID_ARGUMENT for a malformed address.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);

  // Shutdown(zero grace) unless it already ran.
  ~GrpcServer();

  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }

  // A channel to this server inside the process (gRPC's in-process transport: no socket, no TLS,
  // the same services and limits), for a front served by the same process (`k3serve serve`).
  // Calls on it fail UNAVAILABLE after Shutdown.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Sets the health of `service` ("" for overall). Names outside the options' list become known
  // to the health service from then on. No effect after Shutdown.
  void SetServing(const std::string& service, bool serving);

  // Reports every service NOT_SERVING, stops accepting calls, lets calls in flight finish for up
  // to `grace` and cancels the rest, then waits until the server is idle. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}

  std::unique_ptr<grpc::Server> server_;
  const int port_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// Asks the server behind `channel` whether `service` ("" for overall) is serving: true for
// SERVING, false for NOT_SERVING. NOT_FOUND when the server does not know the name; the call's
// own error (UNAVAILABLE, DEADLINE_EXCEEDED, ...) when it is unreachable within `timeout`.
absl::StatusOr<bool> CheckServing(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& service, absl::Duration timeout);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_GRPC_SERVER_H_
