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

#include "absl/base/thread_annotations.h"
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

class WorkerPool;

// One Generate stream, which outlives its attention worker. Next and Finish from one thread;
// Cancel from any thread, any time. Destroying an unfinished call cancels it (the worker frees the
// request's state) and waits for gRPC to end it.
//
// Resuming: the call keeps the request's prompt ids and the tokens it handed out. When the worker's
// stream breaks before its Complete (UNAVAILABLE or CANCELLED that this side did not ask for: the
// worker died or restarted), the call starts the request again, on the pool's best worker (the
// restarted one or another), as prompt + tokens handed out with max_new_tokens reduced by their
// count, waiting up to WorkerPool's resume timeout for a worker to take it. The continuation's
// messages are rewritten as the original stream's (prompt_tokens and generated_tokens counted as
// if nothing happened), so the client sees one stream with no token missing or repeated (greedy:
// the same tokens as without the fault). Not resumed (the stream fails, saying why): a request
// with an output constraint (its grammar state is the worker's), or one whose prompt ids are
// unknown. A resumed stream's text starts afresh at the cut (a character split across the cut is
// lost as U+FFFD in rare cases).
class GenerateCall {
 public:
  ~GenerateCall();

  // The next message; false at the end of the stream (then Finish).
  bool Next(k3serve::v1::GenerateResponse* response);
  // Cancels the call: the worker cancels the request and frees its state.
  void Cancel();
  // The index (in WorkerPool's address order) of the worker serving the call now.
  int worker() const { return worker_.load(); }
  // Times the request was started again on a worker after its worker was lost.
  int resumes() const { return resumes_; }
  // The call's status once Next returned false (CANCELLED after Cancel).
  absl::Status Finish();

 private:
  friend class WorkerPool;
  // One worker's Generate stream.
  struct Stream {
    ~Stream();  // cancels and ends it unless finished; ends its share of the worker's load
    std::shared_ptr<std::atomic<int>> load;  // its worker's calls in flight
    int worker = -1;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<k3serve::v1::GenerateResponse>> reader;
    bool finished = false;
    absl::Status Finish();  // once Read returned false
  };
  GenerateCall() = default;
  // The stream broke with `status` before its Complete: starts the request again (see the class
  // comment). OK with the new stream's first message in first_; else the call's final error.
  absl::Status Resume(const absl::Status& status);
  bool cancelled();
  // Rewrites a resumed stream's message as the original stream's and records its tokens.
  void Account(k3serve::v1::GenerateResponse* response);

  WorkerPool* pool_ = nullptr;
  k3serve::v1::GenerateRequest request_;  // as first sent
  std::string traceparent_;
  std::vector<int32_t> prompt_;  // the request's prompt ids; empty: unknown (not resumable)
  std::vector<int32_t> sent_;    // the tokens handed out by Next
  int prompt_tokens_ = -1;       // the original stream's prompt_tokens
  int base_ = 0;                 // tokens handed out before the current stream started
  int resumes_ = 0;
  bool complete_ = false;        // a Complete was handed out
  bool ended_ = false;           // Next returned false, or Finish ended the stream
  absl::Status final_;           // once Next returned false
  std::atomic<int> worker_{-1};
  absl::Mutex mu_;               // Cancel against the swap of stream_
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  bool has_first_ = false;
  k3serve::v1::GenerateResponse first_;  // read by Start (or Resume), handed out by Next
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
  // tried last for the next kDownFor; when all are, they are tried again (back-off 100 ms doubling
  // to 1 s) until the resume timeout (a restarting worker), then UNAVAILABLE naming the workers
  // (also when no name has resolved to any worker). The call resumes the request on another
  // worker when its worker is lost (GenerateCall).
  // A non-empty `traceparent` (the client's W3C trace context) goes with the call as metadata.
  // `affinity_prompt`: the prompt's token ids for the prefix hint (and for resuming) when the
  // request gives its prompt as text or messages (empty: the request's prompt_token_ids).
  absl::StatusOr<std::unique_ptr<GenerateCall>> Start(
      const k3serve::v1::GenerateRequest& request, const std::string& traceparent = "",
      absl::Span<const int32_t> affinity_prompt = {});

  // Ends the waits for a worker (Start and resuming calls fail UNAVAILABLE "the front is shutting
  // down") and the re-resolving; for the front's shutdown. Idempotent.
  void Stop();

  // How long a request waits for a worker to take it, at its start and after its worker was lost
  // (default 30 s; the front's --resume-timeout-ms). Call before the first Start.
  void set_resume_timeout(absl::Duration timeout) { resume_timeout_ = timeout; }

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
  // One pass over the workers, best first: the first stream that answers with a message (read
  // into `*first`), or the status that ends the request (not UNAVAILABLE), or UNAVAILABLE naming
  // the workers that were.
  absl::StatusOr<std::unique_ptr<GenerateCall::Stream>> Open(
      const k3serve::v1::GenerateRequest& request, const std::string& traceparent,
      absl::Span<const int32_t> prompt, k3serve::v1::GenerateResponse* first);
  // Open, again after a back-off while every worker is UNAVAILABLE, until `deadline` or until
  // `call` (if not null) is cancelled.
  absl::StatusOr<std::unique_ptr<GenerateCall::Stream>> OpenWaiting(
      const k3serve::v1::GenerateRequest& request, const std::string& traceparent,
      absl::Span<const int32_t> prompt, k3serve::v1::GenerateResponse* first, absl::Time deadline,
      GenerateCall* call = nullptr);
  // Resolves `name` again and updates its workers.
  void Refresh(Name& name);
  void RefreshLoop();

  friend class GenerateCall;
  absl::Duration resume_timeout_ = absl::Seconds(30);
  const ClientTls tls_;
  const std::string auth_token_;
  const WorkerPoolResolver resolver_;
  mutable absl::Mutex mu_;
  // Never shrinks; a Worker is never destroyed before the pool (calls hold its stub).
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<Name> names_;  // only the refresh thread touches them after construction
  absl::Mutex stop_mu_;  // Stop against Stop
  absl::Notification stop_;
  std::thread refresher_;
  std::atomic<size_t> next_{0};
  PrefixAffinity affinity_{kAffinityBlockTokens, kAffinityCapacity};
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_WORKER_POOL_H_
