// The HTTP front's gRPC side: k3serve.v1.K3Serve on a set of attention workers, each new call on
// the least-loaded reachable worker (fewest of this front's calls in flight; ties in turn), and
// on another one when that worker is unreachable. A prompt that extends one this front sent
// before (a conversation's next turn: same leading blocks of tokens, PrefixAffinity) goes to the
// worker that served it, where its prefix is cached, unless that worker is down or has
// kAffinitySlack more calls in flight than the least-loaded one.
//
// Workers behind one name: an address `dns:///NAME:PORT` (a headless Service, whose name resolves
// to every ready pod) is resolved here into one worker per address, each with its own load,
// prefix affinity and down state, so a draining pod's UNAVAILABLE sends the call to another pod
// and not to the same name again. The name is resolved again every
// WorkerPoolResolver::interval: pods that appear (a scale-up) get calls within one interval, pods
// that vanish get none (their calls in flight finish). A worker's index never changes and never
// goes away, so GenerateCall::worker and stub(index) stay valid.
#ifndef K3SERVE_HTTP_FRONT_WORKER_POOL_H_
#define K3SERVE_HTTP_FRONT_WORKER_POOL_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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

// How WorkerPool turns `dns:///HOST:PORT` into worker addresses.
struct WorkerPoolResolver {
  // HOST and PORT to gRPC addresses ("10.0.0.7:50051", "[fd00::7]:50051"); the default asks the
  // system resolver (getaddrinfo) for HOST's IPv4 and IPv6 addresses. An error, or no address,
  // leaves the workers as they were (a DNS hiccup must not empty the pool).
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host, int port)>
      resolve;
  absl::Duration interval = absl::Seconds(5);
};

// The system resolver's addresses of `host` with `port`, deduplicated, sorted.
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host, int port);

// Thread-safe; the channels connect lazily and reconnect on their own.
class WorkerPool {
 public:
  // `addresses`: gRPC targets of the attention workers: host:port (one worker), or
  // dns:///HOST:PORT (one worker per address HOST resolves to, now and every resolver.interval);
  // at least one. `tls`: how to dial them (a worker found through HOST is dialled by address and
  // expects HOST in its certificate unless --tls-server-name says otherwise); `auth_token`: the
  // bearer token sent with every call (empty: none).
  explicit WorkerPool(const std::vector<std::string>& addresses, const ClientTls& tls = ClientTls(),
                      std::string auth_token = "", WorkerPoolResolver resolver = {});
  ~WorkerPool();  // stops re-resolving
  // One worker reached through `channel` (e.g. the in-process channel of a server in this
  // process: `k3serve serve`), called `name` in errors.
  WorkerPool(std::string name, std::shared_ptr<grpc::Channel> channel, std::string auth_token);

  // Starts Generate on the least-loaded worker and waits for its first message, so that a
  // rejected request fails here with the worker's status (INVALID_ARGUMENT, ...). A worker that is
  // UNAVAILABLE before answering (down, draining) is skipped for the next least-loaded one and
  // tried last for the next kDownFor; when all are, UNAVAILABLE naming the last error (also when
  // no name has resolved to any worker).
  // A non-empty `traceparent` (the client's W3C trace context) goes with the call as metadata.
  // `affinity_prompt`: the prompt's token ids for the prefix hint when the request gives its
  // prompt as text or messages (empty: the request's prompt_token_ids).
  absl::StatusOr<std::unique_ptr<GenerateCall>> Start(
      const k3serve::v1::GenerateRequest& request, const std::string& traceparent = "",
      absl::Span<const int32_t> affinity_prompt = {});

  // Worker `index`'s stub, for calls that go to a chosen worker (Abort to the one serving the
  // request) or to any (ModelInfo); the bearer token is the caller's to add (AddAuth).
  // REQUIRES: 0 <= index < size().
  k3serve::v1::K3Serve::Stub* stub(int index) const;
  // The worker a call with no prefix to follow would go to now (least loaded, up first); -1 when
  // there is none.
  int LeastLoaded();
  // Adds this pool's bearer token to `context`.
  void AddAuth(grpc::ClientContext* context) const;

  // OK when some worker says it can serve (its gRPC readiness: registered, cluster ready with
  // every expert hosted, a router connected, not draining) within `timeout`; else UNAVAILABLE
  // with the last worker's reason. Backs the front's /healthz.
  absl::Status Ping(absl::Duration timeout);

  // Workers ever known, the ones a name no longer resolves to included (their indices stay).
  size_t size() const;
  // This front's calls in flight on each worker, by index (for tests and metrics).
  std::vector<int> Loads() const;
  // Each worker's address, by index; "" for one its name no longer resolves to.
  std::vector<std::string> Addresses() const;

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
    std::atomic<bool> gone{false};          // its name no longer resolves to it: no new calls
  };
  // A dns:/// address and the workers it resolved to (address -> index).
  struct Name {
    std::string target, host;
    int port = 0;
    std::map<std::string, size_t> workers;
  };
  // Worker indices, best first: up before down, then fewest calls, ties from a rotating start;
  // the worker holding `prompt`'s prefix first when it is up and within kAffinitySlack. Workers
  // that are gone are left out.
  std::vector<size_t> Order(absl::Span<const int32_t> prompt);
  Worker* worker(size_t index) const;
  // Adds a worker for `address` (a new index) and returns it.
  Worker* Add(const std::string& address, const std::string& expected_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves `name` again and updates its workers.
  void Refresh(Name& name);
  void RefreshLoop();

  const ClientTls tls_;
  const std::string auth_token_;
  const WorkerPoolResolver resolver_;
  mutable absl::Mutex mu_;
  // Never shrinks; a Worker is never destroyed before the pool (calls hold its stub).
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<Name> names_;  // only the refresh thread touches them after construction
  absl::Notification stop_;
  std::thread refresher_;
  std::atomic<size_t> next_{0};
  PrefixAffinity affinity_{kAffinityBlockTokens, kAffinityCapacity};
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_WORKER_POOL_H_
