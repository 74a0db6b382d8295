// The HTTP front's gRPC side: k3serve.v1.K3Serve on a set of attention workers, each new call on
// the least-loaded reachable worker (fewest of this front's calls in flight; ties in turn), and
// on another one when that worker is unreachable. A prompt that extends one this front sent
// before (a conversation's next turn: same leading blocks of tokens, PrefixAffinity) goes to the
// worker that served it, where its prefix is cached, unless that worker is down or has
// kAffinitySlack more calls in flight than the least-loaded one.
#ifndef K3SERVE_HTTP_FRONT_WORKER_POOL_H_
#define K3SERVE_HTTP_FRONT_WORKER_POOL_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cluster/security.h"
#include "http_front/prefix_affinity.h"
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
  // The index (in WorkerPool's address order) of the worker serving the call.
  int worker() const { return worker_; }
  // The call's status once Next returned false (CANCELLED after Cancel).
  absl::Status Finish();

 private:
  friend class WorkerPool;
  GenerateCall() = default;
  // Ends the call's share of its worker's load (once).
  void Release();

  std::shared_ptr<std::atomic<int>> load_;  // its worker's calls in flight; null once released
  int worker_ = -1;
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
  // One worker reached through `channel` (e.g. the in-process channel of a server in this
  // process: `k3serve serve`), called `name` in errors.
  WorkerPool(std::string name, std::shared_ptr<grpc::Channel> channel, std::string auth_token);

  // Starts Generate on the least-loaded worker and waits for its first message, so that a
  // rejected request fails here with the worker's status (INVALID_ARGUMENT, ...). A worker that is
  // UNAVAILABLE before answering (down, draining) is skipped for the next least-loaded one and
  // tried last for the next kDownFor; when all are, UNAVAILABLE naming the last error.
  // A non-empty `traceparent` (the client's W3C trace context) goes with the call as metadata.
  // `affinity_prompt`: the prompt's token ids for the prefix hint when the request gives its
  // prompt as text or messages (empty: the request's prompt_token_ids).
  absl::StatusOr<std::unique_ptr<GenerateCall>> Start(
      const k3serve::v1::GenerateRequest& request, const std::string& traceparent = "",
      absl::Span<const int32_t> affinity_prompt = {});

  // Worker `index`'s stub, for calls that go to a chosen worker (Abort to the one serving the
  // request) or to any (ModelInfo); the bearer token is the caller's to add (AddAuth).
  // REQUIRES: 0 <= index < size().
  k3serve::v1::K3Serve::Stub* stub(int index) const { return workers_[index]->stub.get(); }
  // The worker a call with no prefix to follow would go to now (least loaded, up first).
  int LeastLoaded() { return static_cast<int>(Order({}).front()); }
  // Adds this pool's bearer token to `context`.
  void AddAuth(grpc::ClientContext* context) const;

  // OK when some worker says it can serve (its gRPC readiness: registered, cluster ready with
  // every expert hosted, a router connected, not draining) within `timeout`; else UNAVAILABLE
  // with the last worker's reason. Backs the front's /healthz.
  absl::Status Ping(absl::Duration timeout);

  size_t size() const { return workers_.size(); }
  // This front's calls in flight on each worker, in address order (for tests and metrics).
  std::vector<int> Loads() const;

  static constexpr absl::Duration kDownFor = absl::Seconds(2);
  // How much busier than the least-loaded worker a prefix's worker may be and still get the call.
  static constexpr int kAffinitySlack = 2;
  // The prefix blocks the affinity hashes (the workers' default --prefix-block-tokens) and how
  // many prefix hashes it remembers (about 50 bytes each).
  static constexpr int64_t kAffinityBlockTokens = 64;
  static constexpr size_t kAffinityCapacity = size_t{1} << 18;

 private:
  struct Worker {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<k3serve::v1::K3Serve::Stub> stub;
    std::shared_ptr<std::atomic<int>> load = std::make_shared<std::atomic<int>>(0);
    std::atomic<int64_t> down_until_ns{0};  // absl::ToUnixNanos; skipped before then
  };
  // Worker indices, best first: up before down, then fewest calls, ties from a rotating start;
  // the worker holding `prompt`'s prefix first when it is up and within kAffinitySlack.
  std::vector<size_t> Order(absl::Span<const int32_t> prompt);
  void AddWorker(std::string address, std::shared_ptr<grpc::Channel> channel);

  std::vector<std::unique_ptr<Worker>> workers_;
  const std::string auth_token_;
  std::atomic<size_t> next_{0};
  PrefixAffinity affinity_{kAffinityBlockTokens, kAffinityCapacity};
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_WORKER_POOL_H_
