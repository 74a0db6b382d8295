#include "tools/serve_command.h"

#include <iostream>
#include <utility>

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/node_process.h"
#include "cluster/node_runtime.h"
#include "engine/local_routed_moe.h"
#include "glog/logging.h"
#include "model/weights.h"

namespace k3 {

void AddServeFlags(CLI::App* app, ServeOptions* options) {
  NodeFlags& node = options->generate.node;
  app->add_option("--model", node.model, "model folder (checkpoint and tokenizer)")->required();
  AddListenFlags(app, &node);
  app->add_option("--trace-file", node.trace_file,
                  "append the spans of requests traced with a sampled W3C traceparent to this "
                  "file, one JSON object per line");
  AddGenerateServingFlags(app, &options->generate);
  options->http.port = 8000;
  AddBoundedInt(app, "--http-port", &options->http.port, -1, 65535,
                "the OpenAI-compatible HTTP API's port (-1: none, 0 picks a free one)");
  AddOpenAiApiFlags(app, &options->http);
}

absl::StatusOr<std::unique_ptr<OneProcessServer>> OneProcessServer::Start(
    const ServeOptions& options) {
  K3_RETURN_IF_ERROR(options.generate.scheduler.Validate());
  std::unique_ptr<OneProcessServer> server(new OneProcessServer);
  server->options_ = options;
  const std::string& model = options.generate.node.model;
  const absl::Time load_start = absl::Now();
  K3_ASSIGN_OR_RETURN(server->weights_, LoadWeights(model, WeightSelection::All()));
  LOG(INFO) << "weights of " << model << ": " << server->weights_->selected_bytes
            << " bytes, loaded in " << absl::FormatDuration(absl::Now() - load_start);
  server->moe_ = std::make_unique<LocalRoutedMoe>(server->weights_.get());
  K3_ASSIGN_OR_RETURN(server->generate_,
                      AttentionServer::StartStandalone(options.generate, server->weights_.get(),
                                                       server->moe_.get()));
  if (options.http.port >= 0) {
    HttpFrontOptions http = options.http;
    http.model = model;
    http.host = options.generate.node.host;
    http.tls = options.generate.node.tls;
    http.auth_token_file = options.generate.auth_token_file;
    http.metrics_port = -1;
    http.backend = server->generate_->InProcessChannel();
    K3_ASSIGN_OR_RETURN(server->http_, HttpFront::Start(http));
  }
  return server;
}

OneProcessServer::~OneProcessServer() { Shutdown(); }

void OneProcessServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (generate_ != nullptr) {
    // The HTTP API's requests are the generation service's too: drain them all before either
    // stops (new ones meanwhile get UNAVAILABLE, 503 over HTTP).
    generate_->Drain(absl::Now() + options_.generate.drain_timeout);
  }
  if (http_ != nullptr) http_->Shutdown();
  if (generate_ != nullptr) generate_->Shutdown();
}

Subcommand AddServeCommand(CLI::App* top) {
  return AddSubcommand(
      top, "serve",
      "the whole service in one process (every tier, gRPC and the OpenAI HTTP API) for one "
      "machine",
      AddServeFlags, [](const ServeOptions& options) {
        return RunProcessNode<OneProcessServer>(
            "serve", options, [&options](OneProcessServer& server) {
              // Launchers, tests and people read the addresses from these lines.
              const std::string host = AdvertisedHost(options.generate.node.host);
              std::cout << "generate address: " << HostPort(host, server.grpc_port()) << "\n";
              if (server.http_port() >= 0) {
                std::cout << "http address: " << HostPort(host, server.http_port()) << "\n";
              }
              if (server.metrics_port() >= 0) {
                std::cout << "metrics address: " << HostPort(host, server.metrics_port())
                          << "\n";
              }
              std::cout << std::flush;
            });
      });
}

}  // namespace k3
