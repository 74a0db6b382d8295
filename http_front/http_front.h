// The OpenAI-compatible HTTP front: `k3serve http --server HOST:PORT[,HOST:PORT...] --model DIR
//   [--host H] [--port P] [--metrics-port P] [--grpc-port P] [--api-key-file F]
//   [--served-model-name NAME] [--auth-token-file F] [--tls-cert F --tls-key F] [--tls-ca F]`.
//
// Security: --auth-token-file holds the attention workers' bearer token (their
// --auth-token-file): the front sends it with every gRPC call, and its own clients must send
// `Authorization: Bearer <token>` too (the scheme in any case; 401 with WWW-Authenticate
// otherwise), unless --api-key-file gives them a key of their own. The TLS flags are the front's
// gRPC client credentials towards the workers (and its gRPC health port's), and --tls-cert with
// --tls-key make the HTTP API HTTPS (no client certificates asked).
//
// A separate role in front of the attention workers (docs/ARCHITECTURE.md): it holds no model
// state, only the model folder's tokenizer, and calls k3serve.v1.K3Serve on the workers
// (WorkerPool: least loaded, prefix-aware; --server dns:///NAME:PORT is every pod of a headless
// Service, resolved again every 5 s) with token ids, so the workers' API stays the ground truth
// and fronts scale on their own. It does not register with the coordinator.
//
// Connections (cpp-httplib; connection_queue.h): a listen backlog of --listen-backlog (httplib's
// own is 5), a thread per connection (so a stream never waits for a pool's thread), up to
// --max-connections at once; a connection past that gets 503 with Retry-After and is closed
// (k3_http_shed_connections_total counts them). Bodies over --max-body-bytes get 413, whatever
// their content type. Metrics: k3_http_responses_total by status, k3_http_request_seconds and
// k3_http_time_to_first_token_seconds by endpoint.
//
// Endpoints:
//   GET  /v1/models, /v1/models/{model}
//   POST /v1/completions        prompt as a string or token ids
//   POST /v1/chat/completions   messages rendered with the tokenizer's chat format (`developer`
//                               messages as `system` ones)
// both with stream (server-sent events ending "data: [DONE]"), max_tokens, temperature, top_p,
// seed, stop (strings, matched on the text across token boundaries), n (one gRPC call per
// choice; with a seed, choice i uses seed + i), logprobs (chat: logprobs + top_logprobs;
// completions: logprobs N), skip_special_tokens (default true), and for chat
// chat_template_kwargs.thinking (K3's think block, off by default); generation also
// stops at the tokenizer's eos and, for chat, at the end of the assistant's turn. Errors have
// OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad input, 401 a missing or
// wrong bearer token (with --api-key-file), 404 unknown route or model, 413 a body over
// --max-body-bytes, 503 no worker reachable or too many connections.
// Unset max_tokens and temperature take OpenAI's defaults (as many tokens as the workers allow;
// temperature 1) unless --default-max-tokens / --default-temperature say otherwise.
// A client that disconnects has its gRPC calls cancelled, which frees the requests' state on the
// worker: a stream's at its next event (the write fails), a non-streamed request's at its next
// token (ClientConnection sees the socket closed). /healthz (some worker answers) and /metrics
// are on --metrics-port, from the node runtime.
//
// gRPC (--grpc-port): k3serve.v1.K3Serve itself, forwarded to the same workers with the same
// balancing and prefix hints (K3ServeProxy, grpc_proxy.h), for clients of proto/generate.proto.
//
// Thread-safety: HttpFront's methods may be called from any thread; Shutdown from one.
#ifndef K3SERVE_HTTP_FRONT_HTTP_FRONT_H_
#define K3SERVE_HTTP_FRONT_HTTP_FRONT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "cluster/command_line.h"

namespace k3 {

struct HttpFrontOptions {
  std::vector<std::string> servers;  // attention workers' gRPC addresses
  std::string model;                 // the folder with the tokenizer files
  std::string host = "0.0.0.0";
  int port = 8000;  // 0 picks a free one
  int metrics_port = -1;
  // k3serve.v1.K3Serve forwarded to the workers (grpc_proxy.h) and grpc.health.v1 (process
  // liveness); 0 picks a free one.
  int grpc_port = 0;
  std::string api_key_file;       // empty: no authentication
  std::string served_model_name;  // empty: the model folder's name
  std::string auth_token_file;    // the workers' bearer token; empty: none
  TlsFlags tls;                   // towards the workers; --tls-cert/--tls-key also serve HTTPS
  // Connection handling (connection_queue.h): the listen backlog asked of the kernel (which caps
  // it at net.core.somaxconn), the connections served at once (503 with Retry-After beyond), and
  // the largest request body (413 beyond, whatever its content type).
  // What requests that do not say get (OpenAI's defaults): max_tokens (0: as many as the workers
  // allow) and temperature.
  int default_max_tokens = 0;
  // How long a request waits for a worker (--resume-timeout-ms; WorkerPool::set_resume_timeout).
  absl::Duration resume_timeout = absl::Seconds(30);
  float default_temperature = 1.f;
  int listen_backlog = 4096;
  int max_connections = 2048;
  // The workers' default --max-request-bytes: a larger prompt would not reach them.
  int64_t max_body_bytes = 4 << 20;
  // The workers' API inside this process (`k3serve serve`: the attention server's in-process
  // channel), instead of `servers`: then the front opens no gRPC port or metrics endpoint of its
  // own (the process's gRPC port serves K3Serve itself, its metrics endpoint the same registry),
  // and the TLS flags only make the HTTP API HTTPS.
  std::shared_ptr<grpc::Channel> backend;
};

// Every flag of `k3serve http`.
void AddHttpFrontFlags(CLI::App* app, HttpFrontOptions* options);
// The ones about the OpenAI API itself, not where the workers are or what this process listens
// on: the API key, the served name, request defaults and the connection limits. `k3serve serve`
// declares these too.
void AddOpenAiApiFlags(CLI::App* app, HttpFrontOptions* options);

// Serves until SIGINT/SIGTERM; the exit status (0 clean, 1 failed).
int RunHttpFront(const HttpFrontOptions& options);

// `k3serve http`: AddHttpFrontFlags and RunHttpFront as a subcommand of `top`.
Subcommand AddHttpFrontCommand(CLI::App* top);

class HttpFront {
 public:
  // Loads the tokenizer and the API key, binds and starts serving. FAILED_PRECONDITION without a
  // tokenizer, INVALID_ARGUMENT for bad options, UNAVAILABLE when the port is taken.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontOptions& options);
  ~HttpFront();  // Shutdown()

  int port() const;
  // Stops accepting, cancels the streams in flight and joins the threads. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit HttpFront(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_HTTP_FRONT_H_
