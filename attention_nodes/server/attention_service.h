// The gRPC services of an attention node, over its GenerationScheduler:
//
// k3serve.v1.K3Serve (proto/generate.proto), on gRPC's callback API so that a stream costs no
// thread while it waits for tokens:
//  - Generate: validation errors fail the call before any message (INVALID_ARGUMENT, or
//    ALREADY_EXISTS for a request_id in flight; UNAVAILABLE while draining). Otherwise one
//    TokenChunk per generated token, then one Complete with the finish reason and usage. The call
//    ends OK after LENGTH, STOP and an Abort; after a failed model step it sends Complete{ERROR}
//    and ends with UNAVAILABLE (INTERNAL for non-transient failures) carrying the cause, which
//    names the lost expert worker when the router reported one; at shutdown Complete{CANCELLED}
//    and UNAVAILABLE. A client that cancels the stream (or whose deadline passes) has its request
//    cancelled and its state freed at the next step boundary.
//    Unset sampling fields take the defaults: greedy, top_p 1, no top-k, a random seed,
//    max_new_tokens kDefaultMaxNewTokens (capped by the server's limit; 0 asks for the limit).
//    top_logprobs adds each token's log-probabilities to the chunks (LogprobsOf, sampler.h).
//    With a tokenizer, a prompt may come as text or chat messages (chat adds the turn end as a stop
//    token), and every chunk carries the text its tokens complete (StreamingDecoder: never half
//    a character; stop tokens and eos add no text); without one, such prompts are
//    INVALID_ARGUMENT and chunks carry ids only.
//  - Abort: cancels by id (the stream ends with CANCELLED and status OK); `found` says whether.
//  - GetModelInfo, GetServerInfo (the scheduler's counts, uptime, draining).
//  Access (K3ServeLimits): with an auth token, every K3Serve call without "authorization: Bearer
//  <token>" metadata, or with another token, ends UNAUTHENTICATED before anything else (compared
//  in constant time; grpc.health.v1 and AttentionControl are other services and stay open). A
//  Generate call beyond max_streams_per_client streams in flight from one client address (the
//  peer's IP, whatever its port) ends RESOURCE_EXHAUSTED before any message.
//
// k3serve.cluster.v1.AttentionControl.Drain, synchronous (it blocks until drained): calls the
// owner's drain function.
//
// The services borrow the scheduler, which must outlive the gRPC server that serves them.
#ifndef K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVICE_H_
#define K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "cluster/metrics.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

inline constexpr char kK3ServeServiceName[] = "k3serve.v1.K3Serve";
inline constexpr int kDefaultMaxNewTokens = 16;

// `tokenizer`: the model's, or null to serve token ids only. `metrics` (may be null; must outlive
// the service) gets k3_attention_generate_calls_total{code}: every Generate call, counted once
// with the gRPC status code it ends with (OK, INVALID_ARGUMENT, UNAVAILABLE, CANCELLED, ...),
// before the client sees that status.
struct K3ServeLimits {
  std::string auth_token;          // empty: no token required
  int max_streams_per_client = 0;  // Generate streams in flight per client address; 0: no limit
};

std::unique_ptr<grpc::Service> NewK3ServeService(GenerationScheduler* scheduler,
                                                 std::shared_ptr<const Tokenizer> tokenizer,
                                                 MetricsRegistry* metrics = nullptr,
                                                 K3ServeLimits limits = K3ServeLimits());

// The client address of a gRPC peer string without its port: "ipv4:10.0.0.1:5000" -> "10.0.0.1",
// "ipv6:[::1]:5000" -> "::1"; anything else unchanged.
std::string PeerHost(const std::string& peer);

// `drain(deadline, done)` stops admitting and returns at once; once the requests in flight end,
// or at `deadline` (infinite future: never) after cancelling what is left, it calls `done` with
// how many were still running then (AttentionServer::DrainAsync).
using AttentionDrain =
    std::function<void(absl::Time deadline, std::function<void(int left)> done)>;
std::unique_ptr<grpc::Service> NewAttentionControlService(AttentionDrain drain);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SERVER_ATTENTION_SERVICE_H_
