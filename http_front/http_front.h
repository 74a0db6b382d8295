// The OpenAI-compatible HTTP front: `k3serve http --server HOST:PORT[,HOST:PORT...] --model DIR
//   [--host H] [--port P] [--metrics-port P] [--grpc-port P] [--api-key-file F]
//   [--served-model-name NAME] [--auth-token-file F] [--tls-cert F --tls-key F] [--tls-ca F]`.
//
// Security: --auth-token-file holds the attention workers' bearer token (their
// --auth-token-file): the front sends it with every gRPC call, and its own clients must send
// `Authorization: Bearer <token>` too (401 otherwise), unless --api-key-file gives them a key of
// their own. The TLS flags are the front's gRPC client credentials towards the workers (and its
// gRPC health port's); the HTTP API itself is plain HTTP (terminate TLS in front of it).
//
// A separate role in front of the attention workers (docs/ARCHITECTURE.md): it holds no model
// state, only the model folder's tokenizer, and calls k3serve.v1.K3Serve on the workers
// round-robin with token ids, so the workers' API stays the ground truth and fronts scale on
// their own. It does not register with the coordinator.
//
// Endpoints (cpp-httplib, one thread per connection of a pool):
//   GET  /v1/models
//   POST /v1/completions        prompt as a string or token ids
//   POST /v1/chat/completions   messages rendered with the tokenizer's chat format
// both with stream (server-sent events ending "data: [DONE]"), max_tokens, temperature, top_p,
// seed, stop (strings, matched on the text across token boundaries), n=1 only, and for chat
// chat_template_kwargs.thinking (K3's think block, off by default); generation also
// stops at the tokenizer's eos and, for chat, at the end of the assistant's turn. Errors have
// OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad input, 401 a missing or
// wrong bearer token (with --api-key-file), 404 unknown route or model, 503 no worker reachable.
// Unset sampling fields take the workers' defaults (greedy; max_tokens 16), not OpenAI's.
// A client that disconnects from a stream has its gRPC call cancelled at the next event, which
// frees the request's state on the worker; a non-streamed request runs to its end (max_tokens
// bounds it) because the server learns of the disconnect only when it writes. /healthz (some worker answers) and /metrics are on --metrics-port, from
// the node runtime.
//
// Thread-safety: HttpFront's methods may be called from any thread; Stop from one.
#ifndef K3SERVE_HTTP_FRONT_HTTP_FRONT_H_
#define K3SERVE_HTTP_FRONT_HTTP_FRONT_H_

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "cluster/command_line.h"

namespace k3 {

struct HttpFrontOptions {
  std::vector<std::string> servers;  // attention workers' gRPC addresses
  std::string model;                 // the folder with the tokenizer files
  std::string host = "0.0.0.0";
  int port = 8000;  // 0 picks a free one
  int metrics_port = -1;
  int grpc_port = 0;  // the node runtime's grpc.health.v1 (process liveness); 0 picks a free one
  std::string api_key_file;       // empty: no authentication
  std::string served_model_name;  // empty: the model folder's name
  std::string auth_token_file;    // the workers' bearer token; empty: none
  TlsFlags tls;                   // towards the workers
};

void AddHttpFrontFlags(CLI::App* app, HttpFrontOptions* options);

// Serves until SIGINT/SIGTERM; the exit status (0 clean, 1 failed).
int RunHttpFront(const HttpFrontOptions& options);

class HttpFront {
 public:
  // Loads the tokenizer and the API key, binds and starts serving. FAILED_PRECONDITION without a
  // tokenizer, INVALID_ARGUMENT for bad options, UNAVAILABLE when the port is taken.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontOptions& options);
  ~HttpFront();  // Stop()

  int port() const;
  // Stops accepting, cancels the streams in flight and joins the threads. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpFront(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_HTTP_FRONT_H_
