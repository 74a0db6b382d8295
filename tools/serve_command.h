// `k3serve serve --model DIR`: the whole service in one process, for one machine (a laptop, one
// CPU server, one GPU). It holds every tier: the GenerationScheduler (continuous batching, the
// token budget, the prefix cache) steps the forward pass in this process (on the CPU, or on
// `--device cuda:N` through the GPU step runner), and each MoE layer's router math and routed
// experts run in process too (LocalRoutedMoe) instead of across the data plane. It serves:
//   - k3serve.v1.K3Serve and grpc.health.v1 on --port (the attention worker's service itself);
//   - the OpenAI HTTP API on --http-port: the HTTP front's handlers (http_front/http_front.h),
//     whose gRPC calls go to the service above over gRPC's in-process transport (no socket, no
//     second process, no extra hop on the network);
//   - Prometheus /metrics and /healthz on --metrics-port, one registry for both APIs.
// Its flags are those of the roles it merges, declared by the same functions: the attention
// worker's serving flags (AddGenerateServingFlags) and the HTTP front's API flags
// (AddOpenAiApiFlags), plus the listen flags every node has. The TLS flags secure the gRPC port
// and make the HTTP API HTTPS; --auth-token-file is required from the clients of both APIs
// (--api-key-file gives the HTTP clients a key of their own).
//
// When to use it instead of `k3serve local` or the Kubernetes manifests: README "One machine:
// k3serve serve".
#ifndef K3SERVE_TOOLS_SERVE_COMMAND_H_
#define K3SERVE_TOOLS_SERVE_COMMAND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "attention_nodes/server/attention_server.h"
#include "cluster/command_line.h"
#include "http_front/http_front.h"

namespace k3 {

struct ServeOptions {
  // node: --model, --host, --port (gRPC), --metrics-port, TLS, --trace-file (no coordinator).
  AttentionServerOptions generate;
  // The OpenAI API; its host, model, TLS and bearer token come from `generate`. port -1: none.
  HttpFrontOptions http;
};

void AddServeFlags(CLI::App* app, ServeOptions* options);

// The running process: the model, the generation service and the HTTP API. Thread-safe as its
// parts; Shutdown from one thread.
class OneProcessServer {
 public:
  // Loads every weight of the model, starts the scheduler and both APIs. The errors of the
  // weights, the step runner (--device) and the endpoints (a taken port, bad TLS files).
  static absl::StatusOr<std::unique_ptr<OneProcessServer>> Start(const ServeOptions& options);
  ~OneProcessServer();  // Shutdown()

  int grpc_port() const { return generate_->port(); }
  int http_port() const { return http_ == nullptr ? -1 : http_->port(); }
  int metrics_port() const { return generate_->metrics_port(); }

  // Drains the requests in flight (both APIs; up to --drain-timeout-ms), then stops the HTTP API
  // and the generation service. Idempotent.
  void Shutdown();

 private:
  OneProcessServer() = default;
  // In dependency order (members are destroyed in reverse).
  ServeOptions options_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<RoutedMoe> moe_;                // reads weights_
  std::unique_ptr<AttentionServer> generate_;     // steps on weights_ and moe_
  std::unique_ptr<HttpFront> http_;               // calls generate_ in process
  bool shut_down_ = false;
};

// `k3serve serve`: AddServeFlags, then OneProcessServer until SIGINT/SIGTERM.
Subcommand AddServeCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_TOOLS_SERVE_COMMAND_H_
