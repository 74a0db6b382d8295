#include "attention_nodes/attention_server.h"

#include <atomic>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attention_nodes/attention_service.h"
#include "attention_nodes/remote_routed_moe.h"
#include "cluster/actor.h"
#include "cluster/coordinator_client.h"
#include "cluster/grpc_server.h"
#include "cluster/metrics.h"
#include "cluster/ucx_transport.h"
#include "glog/logging.h"
#include "model/checkpoint.h"
#include "proto/cluster.pb.h"
#include "cluster/node_process.h"
#include "cluster/peer_links.h"
#include "tools/cli_flags.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr absl::Duration kTickInterval = absl::Milliseconds(200);
constexpr absl::Duration kShutdownGrace = absl::Seconds(1);

int Fail(const absl::Status& status) {
  std::cerr << "k3serve attention: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

struct AttentionServer::Parts {
  explicit Parts(const AttentionServerOptions& o) : options(o) {}

  const AttentionServerOptions options;
  // Declared in the order of construction; destroyed in reverse.
  std::unique_ptr<ModelWeights> weights;  // cluster node only
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<PeerLinks> links;
  std::unique_ptr<RemoteRoutedMoe> remote_moe;
  std::unique_ptr<GenerationScheduler> scheduler;
  std::unique_ptr<grpc::Service> k3serve_service;
  std::unique_ptr<grpc::Service> control_service;
  std::unique_ptr<GrpcServer> server;
  std::unique_ptr<MetricsHttpServer> http;
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<Actor> watcher;

  std::atomic<bool> draining{false};
  bool shut_down = false;  // Shutdown's caller only

  // Watcher thread only.
  bool serving = false;
  bool first_tick = true;
  uint64_t seen_members_version = 0;
  std::vector<PeerTarget> routers;  // the routers of the cluster state
  std::string not_ready_reason;

  Gauge* ready_gauge = nullptr;
  Gauge* routers_gauge = nullptr;
};

AttentionServer::AttentionServer(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

AttentionServer::~AttentionServer() { Shutdown(); }

int AttentionServer::port() const { return parts_->server->port(); }

int AttentionServer::metrics_port() const { return parts_->http ? parts_->http->port() : -1; }

absl::Status AttentionServer::StartServing(const ModelWeights* weights, RoutedMoe* routed_moe) {
  Parts& p = *parts_;
  p.scheduler = std::make_unique<GenerationScheduler>(weights, routed_moe, p.options.scheduler,
                                                      &DefaultMetrics());
  p.k3serve_service = NewK3ServeService(p.scheduler.get());
  p.control_service = NewAttentionControlService([this](absl::Time deadline) {
    return Drain(deadline);
  });
  GrpcServerOptions server_options;
  server_options.address = HostPort(p.options.host, p.options.port);
  server_options.health_services = {kK3ServeServiceName};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(server_options, {p.k3serve_service.get(), p.control_service.get()});
  if (!server.ok()) return server.status();
  p.server = *std::move(server);
  p.server->SetServing("", true);
  if (p.options.metrics_port >= 0) {
    MetricsHttpOptions http_options;
    http_options.host = p.options.host;
    http_options.port = p.options.metrics_port;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(http_options, &DefaultMetrics());
    if (!http.ok()) return http.status();
    p.http = *std::move(http);
  }
  p.ready_gauge =
      DefaultMetrics()
          .AddGauge("k3_attention_ready", "1 while the node admits Generate calls, else 0.")
          .Get();
  p.routers_gauge = DefaultMetrics()
                        .AddGauge("k3_attention_connected_routers",
                                  "Routers this node can send MoE layers to.")
                        .Get();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::StartStandalone(
    const AttentionServerOptions& options, const ModelWeights* weights, RoutedMoe* routed_moe) {
  if (absl::Status s = options.scheduler.Validate(); !s.ok()) return s;
  std::unique_ptr<AttentionServer> node(new AttentionServer(std::make_unique<Parts>(options)));
  if (absl::Status s = node->StartServing(weights, routed_moe); !s.ok()) return s;
  node->parts_->serving = true;
  node->parts_->server->SetServing(kK3ServeServiceName, true);
  node->parts_->ready_gauge->Set(1);
  LOG(INFO) << "standalone attention server on port " << node->port();
  return node;
}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Start(
    const AttentionServerOptions& options) {
  if (absl::Status s = options.scheduler.Validate(); !s.ok()) return s;
  std::unique_ptr<AttentionServer> node(new AttentionServer(std::make_unique<Parts>(options)));
  Parts& p = *node->parts_;

  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(options.model);
  if (!checkpoint.ok()) return checkpoint.status();
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadWeights(std::move(*checkpoint), WeightSelection::AttentionOnly());
  if (!weights.ok()) return weights.status();
  p.weights = *std::move(weights);
  LOG(INFO) << "attention weights of " << options.model << ": " << p.weights->selected_bytes
            << " bytes, loaded in " << absl::FormatDuration(absl::Now() - load_start);

  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create();
  if (!transport.ok()) return transport.status();
  p.transport = *std::move(transport);
  p.links = std::make_unique<PeerLinks>(p.transport.get());
  RemoteRoutedMoeOptions moe_options;
  moe_options.timeout = options.moe_timeout;
  PeerLinks* links = p.links.get();
  moe_options.on_router_failed = [links](PeerId router, const absl::Status& error) {
    links->MarkFailed(router, error);
  };
  p.remote_moe =
      std::make_unique<RemoteRoutedMoe>(p.transport.get(), p.weights->config, moe_options);
  if (absl::Status s = node->StartServing(p.weights.get(), p.remote_moe.get()); !s.ok()) return s;

  const std::string advertised = AdvertisedHost(options.host);
  pb::NodeInfo info;
  info.set_role(pb::ROLE_ATTENTION);
  info.set_grpc_address(HostPort(advertised, p.server->port()));
  info.set_transport_address(p.transport->LocalAddress());
  if (p.http) info.set_metrics_address(HostPort(advertised, p.http->port()));
  p.watcher = std::make_unique<Actor>("attn-watcher");
  CoordinatorClientOptions client_options;
  client_options.coordinator_address = options.coordinator;
  client_options.node = info;
  CoordinatorCallbacks callbacks;
  AttentionServer* self = node.get();
  Actor* watcher = p.watcher.get();
  callbacks.on_cluster_state = [self, watcher](const pb::ClusterState&) {
    watcher->Post([self] { self->Tick(); });
  };
  callbacks.on_drain = [self, watcher] {
    watcher->Post([self] {
      LOG(INFO) << "the coordinator asked this node to drain";
      self->parts_->draining = true;
      self->parts_->scheduler->StopAdmitting();
      self->Tick();
    });
  };
  // Started only once p.client is set: the callbacks' Tick uses it (a Tick that ran first, on a
  // fast registration, dereferenced a null client).
  p.client = std::make_unique<CoordinatorClient>(std::move(client_options), std::move(callbacks));
  p.client->Start();
  node->ScheduleTick();
  LOG(INFO) << "attention node serving gRPC on " << info.grpc_address()
            << (p.http ? absl::StrCat(", metrics on port ", p.http->port()) : "")
            << "; registering with the coordinator at " << options.coordinator;
  return node;
}

void AttentionServer::Tick() {
  Parts& p = *parts_;
  const absl::StatusOr<uint32_t> self = p.client->WaitRegistered(absl::InfinitePast());
  const pb::ClusterState state = p.client->cluster_state();
  if (p.first_tick || state.members_version() != p.seen_members_version) {
    p.first_tick = false;
    p.seen_members_version = state.members_version();
    p.routers = LinkTargets(state, {pb::ROLE_ROUTER}, self.ok() ? *self : 0);
    p.links->SetTargets(p.routers);
  }
  std::vector<PeerId> usable;
  for (const PeerTarget& router : p.routers) {
    if (router.alive && p.links->LinkStatus(router.peer).ok()) usable.push_back(router.peer);
  }
  p.remote_moe->SetRouters(usable);
  p.routers_gauge->Set(static_cast<double>(usable.size()));

  std::string reason;
  if (!self.ok()) {
    reason = "not registered with the coordinator yet";
  } else if (!state.ready()) {
    reason = absl::StrCat("the cluster is not ready: ", state.not_ready_reason());
  } else if (usable.empty()) {
    reason = "no router is connected";
  } else if (p.draining) {
    reason = "draining";
  }
  const bool serving = reason.empty();
  if (serving != p.serving || reason != p.not_ready_reason) {
    p.serving = serving;
    p.not_ready_reason = reason;
    p.server->SetServing(kK3ServeServiceName, serving);
    p.ready_gauge->Set(serving ? 1 : 0);
    LOG(INFO) << "attention node " << (self.ok() ? absl::StrCat(*self) : "?")
              << (serving ? absl::StrCat(" is ready with ", usable.size(), " router(s)")
                          : absl::StrCat(" is not ready: ", reason));
  }

  const SchedulerInfo info = p.scheduler->Info();
  pb::LoadStats load;
  load.set_active_requests(info.active_requests);
  load.set_queued_items(info.active_requests - info.cached_sequences);
  load.set_state_bytes(info.state_bytes);
  p.client->SetLoad(load);
}

void AttentionServer::ScheduleTick() {
  parts_->watcher->PostAfter(kTickInterval, [this] {
    Tick();
    ScheduleTick();
  });
}

int AttentionServer::Drain(absl::Time deadline) {
  Parts& p = *parts_;
  if (!p.draining.exchange(true)) LOG(INFO) << "draining: no new requests are admitted";
  p.scheduler->StopAdmitting();
  p.server->SetServing(kK3ServeServiceName, false);
  p.ready_gauge->Set(0);
  if (p.scheduler->WaitIdle(deadline)) return 0;
  const int left = p.scheduler->Info().active_requests;
  LOG(WARNING) << "drain deadline passed with " << left << " request(s) running; cancelling them";
  p.scheduler->CancelAll(absl::UnavailableError("the server is draining and its deadline passed"));
  return left;
}

void AttentionServer::Shutdown() {
  Parts& p = *parts_;
  if (p.shut_down) return;
  p.shut_down = true;
  if (p.server != nullptr && p.scheduler != nullptr) {
    Drain(absl::Now() + p.options.drain_timeout);
  }
  // The watcher first: it uses everything below.
  if (p.watcher) p.watcher->Stop();
  if (p.scheduler) p.scheduler->Shutdown();
  if (p.client) p.client->Stop();
  if (p.links) p.links->Stop();
  if (p.transport) p.transport->Close();
  if (p.http) p.http->Stop();
  if (p.server) p.server->Shutdown(kShutdownGrace);
}

absl::StatusOr<AttentionServerOptions> ParseAttentionArgs(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(
      args, CliFlags::WithNodeFlags({"max-batch-tokens", "max-sequences", "max-new-tokens-limit",
                                     "max-prompt-tokens", "moe-timeout-ms", "drain-timeout-ms"}));
  if (!flags.ok()) return flags.status();
  AttentionServerOptions options;
  NodeFlags node;
  node.host = options.host;
  if (absl::Status s = flags->ReadNodeFlags(&node); !s.ok()) return s;
  options.coordinator = node.coordinator;
  options.model = node.model;
  options.host = node.host;
  options.port = node.port;
  options.metrics_port = node.metrics_port;

  // Integer flags with their ranges; the values land in `options`.
  struct Bounded {
    const char* flag;
    int64_t fallback, min, max;
    int64_t* out;
  };
  SchedulerOptions& s = options.scheduler;
  int64_t batch = s.max_batch_tokens, sequences = s.max_sequences,
          new_tokens = s.max_new_tokens_limit, prompt = s.max_prompt_tokens,
          moe_ms = absl::ToInt64Milliseconds(options.moe_timeout),
          drain_ms = absl::ToInt64Milliseconds(options.drain_timeout);
  constexpr int64_t kMaxMs = 24 * 3600 * 1000;
  for (const Bounded& b : {Bounded{"max-batch-tokens", batch, 1, 1 << 20, &batch},
                           Bounded{"max-sequences", sequences, 1, 1 << 16, &sequences},
                           Bounded{"max-new-tokens-limit", new_tokens, 1, 1 << 24, &new_tokens},
                           Bounded{"max-prompt-tokens", prompt, 1, 1 << 24, &prompt},
                           Bounded{"moe-timeout-ms", moe_ms, 1, kMaxMs, &moe_ms},
                           Bounded{"drain-timeout-ms", drain_ms, 0, kMaxMs, &drain_ms}}) {
    absl::StatusOr<int64_t> value = flags->Int(b.flag, b.fallback);
    if (!value.ok()) return value.status();
    if (*value < b.min || *value > b.max) {
      return absl::InvalidArgumentError(absl::StrCat("--", b.flag, " is ", *value,
                                                     "; must be in [", b.min, ", ", b.max, "]"));
    }
    *b.out = *value;
  }
  s.max_batch_tokens = batch;
  s.max_sequences = static_cast<int>(sequences);
  s.max_new_tokens_limit = static_cast<int>(new_tokens);
  s.max_prompt_tokens = static_cast<int>(prompt);
  options.moe_timeout = absl::Milliseconds(moe_ms);
  options.drain_timeout = absl::Milliseconds(drain_ms);
  return options;
}

int RunAttentionNode(const std::vector<std::string>& args) {
  absl::StatusOr<AttentionServerOptions> options = ParseAttentionArgs(args);
  if (!options.ok()) return Fail(options.status());
  StopSignals signals;  // before any thread starts
  absl::StatusOr<std::unique_ptr<AttentionServer>> server = AttentionServer::Start(*options);
  if (!server.ok()) {
    LOG(ERROR) << "attention node did not start: " << server.status();
    return 1;
  }
  int signal_number = 0;
  while ((signal_number = signals.Poll()) == 0) absl::SleepFor(absl::Milliseconds(100));
  LOG(INFO) << "attention node got signal " << signal_number << "; draining and shutting down";
  (*server)->Shutdown();
  return 0;
}

}  // namespace k3
