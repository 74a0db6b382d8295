// The HTTP front's gRPC side: k3serve.v1.K3Serve on a set of attention workers, round-robin.
#ifndef K3SERVE_HTTP_FRONT_WORKER_POOL_H_
#define K3SERVE_HTTP_FRONT_WORKER_POOL_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/security.h"
#include "grpcpp/client_context.h"
#include "proto/generate.grpc.pb.h"

namespace k3 {

// One Generate stream. Next and Finish from one thread; Cancel from any thread, any time.
// Destroying an unfinished call cancels it (the worker frees the request's state) and waits for
// gRPC to end it.
class GenerateCall {
 public:
  ~GenerateCall();

  // The next message; false at the end of the stream (then Finish).
  bool Next(k3serve::v1::GenerateResponse* response);
  // Cancels the call: the worker cancels the request and frees its state.
  void Cancel() { context_.TryCancel(); }
  // The call's status once Next returned false (CANCELLED after Cancel).
  absl::Status Finish();

 private:
  friend class WorkerPool;
  GenerateCall() = default;

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<k3serve::v1::GenerateResponse>> reader_;
  bool has_first_ = false;
  bool finished_ = false;
  k3serve::v1::GenerateResponse first_;  // read by Start, handed out by the first Next
};

// Thread-safe; the channels connect lazily and reconnect on their own.
class WorkerPool {
 public:
  // `addresses`: gRPC targets of the attention workers (host:port, or dns:///name:port for a name
  // that resolves to several, whose calls go round-robin over them); at least one.
  // `tls`: how to dial them; `auth_token`: the bearer token sent with every call (empty: none).
  explicit WorkerPool(const std::vector<std::string>& addresses, const ClientTls& tls = ClientTls(),
                      std::string auth_token = "");

  // Starts Generate on the next worker and waits for its first message, so that a rejected
  // request fails here with the worker's status (INVALID_ARGUMENT, ...). A worker that is
  // UNAVAILABLE before answering (down, draining) is skipped for the next one; when all are,
  // UNAVAILABLE naming the last error.
  // A non-empty `traceparent` (the client's W3C trace context) goes with the call as metadata.
  absl::StatusOr<std::unique_ptr<GenerateCall>> Start(const k3serve::v1::GenerateRequest& request,
                                                      const std::string& traceparent = "");

  // OK when some worker answers GetModelInfo within `timeout` (readiness).
  absl::Status Ping(absl::Duration timeout);

  size_t size() const { return stubs_.size(); }

 private:
  struct Worker {
    std::string address;
    std::unique_ptr<k3serve::v1::K3Serve::Stub> stub;
  };
  std::vector<Worker> stubs_;
  const std::string auth_token_;
  std::atomic<size_t> next_{0};
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_WORKER_POOL_H_
