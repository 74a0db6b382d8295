// The client side of k3serve.v1.K3Serve.Generate: sends one request to an attention node and
// collects its streamed tokens. Used by `k3serve generate --server HOST:PORT` and by tests.
#ifndef K3SERVE_ATTENTION_NODES_SERVER_GENERATE_CLIENT_H_
#define K3SERVE_ATTENTION_NODES_SERVER_GENERATE_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cluster/security.h"
#include "proto/generate.pb.h"

namespace k3 {

struct GenerateOutcome {
  std::string request_id;
  std::vector<int32_t> tokens;  // every token streamed, in order
  k3serve::v1::Complete complete;  // the final message: finish reason, usage, message
  // The chunks' and the Complete's text concatenated: the answer as text from a node with a
  // tokenizer (empty from one without).
  std::string text;
  // With SamplingParams.top_logprobs: each token's log-probabilities, in order.
  std::vector<k3serve::v1::TokenLogprobs> logprobs;
};

// A greedy request (temperature 0) for `max_new_tokens` tokens after `prompt`.
k3serve::v1::GenerateRequest GreedyRequest(const std::string& request_id,
                                           const std::vector<int32_t>& prompt, int max_new_tokens);

// Runs `request` on the server at `address` (host:port) with `timeout` as the call's deadline
// (InfiniteDuration: none). The call's own status when it is not OK (INVALID_ARGUMENT,
// UNAVAILABLE naming a lost worker, DEADLINE_EXCEEDED, ...), with the server's message; INTERNAL
// when an OK stream breaks the protocol (no Complete, or messages after it). `on_tokens`, when
// given, sees each chunk's tokens as it arrives, so a caller keeps them even when the call fails.
absl::StatusOr<GenerateOutcome> GenerateOverGrpc(
    const std::string& address, const k3serve::v1::GenerateRequest& request,
    absl::Duration timeout,
    const std::function<void(absl::Span<const int32_t>)>& on_tokens = nullptr);

// How a client reaches a secured server: TLS (plaintext by default) and the bearer token
// (empty: none sent).
struct GenerateClientOptions {
  ClientTls tls;
  std::string auth_token;
};

// GenerateOverGrpc with `client`'s TLS and token; UNAUTHENTICATED from a server that wants a
// token this one lacks, UNAVAILABLE when the TLS handshake fails (wrong CA, no client
// certificate under mutual TLS).
absl::StatusOr<GenerateOutcome> GenerateOverGrpc(
    const GenerateClientOptions& client, const std::string& address,
    const k3serve::v1::GenerateRequest& request, absl::Duration timeout,
    const std::function<void(absl::Span<const int32_t>)>& on_tokens = nullptr);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_SERVER_GENERATE_CLIENT_H_
