#include "attention_nodes/server/attention_server.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/attention_service.h"
#include "attention_nodes/server/device_step_runner.h"
#include "attention_nodes/moe_client/remote_device_experts.h"
#include "attention_nodes/moe_client/remote_routed_moe.h"
#include "base/status_macros.h"
#include "cluster/actor.h"
#include "cluster/gpu_device_channels.h"
#include "cluster/metrics.h"
#include "cluster/node_runtime.h"
#include "cluster/security.h"
#include "cluster/span_log.h"
#include "cluster/node_transport.h"
#include "cluster/ucx_transport.h"
#include "glog/logging.h"
#include "proto/cluster.pb.h"
#include "cluster/node_process.h"
#include "cluster/peer_links.h"
#include "moe/cluster_placement.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr absl::Duration kTickInterval = absl::Milliseconds(200);

}  // namespace

struct AttentionServer::Parts {
  explicit Parts(const AttentionServerOptions& o) : options(o) {}

  const AttentionServerOptions options;
  // Declared in the order of construction; destroyed in reverse.
  std::unique_ptr<ModelWeights> weights;  // cluster node only
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<PeerLinks> links;
  std::unique_ptr<RemoteRoutedMoe> remote_moe;
  // On a GPU whose cluster has GPU expert nodes: the channels to them and the MoE path over them.
  std::unique_ptr<DeviceChannels> device_channels;
  std::unique_ptr<RemoteDeviceExperts> remote_experts;
  std::unique_ptr<SpanLog> spans;  // with --trace-file
  std::unique_ptr<GenerationScheduler> scheduler;
  std::unique_ptr<grpc::Service> k3serve_service;
  std::unique_ptr<grpc::Service> control_service;
  std::unique_ptr<NodeEndpoints> endpoints;
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
  Counter* device_layers = nullptr;  // with remote_experts
  Counter* device_failures = nullptr;
};

AttentionServer::AttentionServer(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

AttentionServer::~AttentionServer() { Shutdown(); }

int AttentionServer::port() const { return parts_->endpoints->port(); }

int AttentionServer::metrics_port() const { return parts_->endpoints->metrics_port(); }

std::shared_ptr<grpc::Channel> AttentionServer::InProcessChannel() {
  return parts_->endpoints->InProcessChannel();
}

absl::Status AttentionServer::StartServing(const ModelWeights* weights, RoutedMoe* routed_moe,
                                          pb::Role role) {
  Parts& p = *parts_;
  SchedulerOptions scheduler_options = p.options.scheduler;
  if (!p.options.node.trace_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<SpanLog> spans,
                        SpanLog::Open(p.options.node.trace_file, "attention"));
    p.spans = std::move(spans);
    scheduler_options.spans = p.spans.get();
  }
  DeviceStateLimits state_limits;
  state_limits.sequences = scheduler_options.max_sequences;
  state_limits.context_tokens =
      int64_t{scheduler_options.max_prompt_tokens} + scheduler_options.max_new_tokens_limit;
  state_limits.cache_pages = p.options.gpu_cache_pages;
  absl::StatusOr<std::unique_ptr<StepRunner>> runner = MakeStepRunner(
      p.options.device, weights, routed_moe, state_limits, p.remote_experts.get());
  if (!runner.ok()) return runner.status();
  LOG(INFO) << "the forward pass runs on " << ComputeDeviceName(p.options.device);
  p.scheduler = std::make_unique<GenerationScheduler>(*std::move(runner), scheduler_options,
                                                      &DefaultMetrics());
  // The model folder's tokenizer, if it has one: text prompts and text deltas.
  std::shared_ptr<const Tokenizer> tokenizer;
  const std::string& model = p.options.node.model;
  if (!model.empty() &&
      std::filesystem::exists(std::filesystem::path(model) / Tokenizer::kRanksFile)) {
    K3_ASSIGN_OR_RETURN(Tokenizer loaded, Tokenizer::Load(model));
    tokenizer = std::make_shared<const Tokenizer>(std::move(loaded));
  } else {
    LOG(INFO) << "no " << Tokenizer::kRanksFile << " in the model folder '" << model
              << "': serving token ids only";
  }
  K3ServeLimits limits;
  limits.max_streams_per_client = p.options.max_streams_per_client;
  if (!p.options.auth_token_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::string token,
                        ReadTokenFile("--auth-token-file", p.options.auth_token_file));
    limits.auth_token = std::move(token);
  }
  p.k3serve_service = NewK3ServeService(p.scheduler.get(), std::move(tokenizer),
                                        &DefaultMetrics(), std::move(limits));
  p.control_service =
      NewAttentionControlService([this](absl::Time deadline, std::function<void(int)> done) {
        DrainAsync(deadline, std::move(done));
      });
  NodeEndpointsOptions endpoint_options;
  endpoint_options.flags = p.options.node;
  endpoint_options.role = role;
  endpoint_options.readiness_service = kK3ServeServiceName;
  endpoint_options.services = {p.k3serve_service.get(), p.control_service.get()};
  endpoint_options.max_receive_message_bytes = p.options.max_request_bytes;
  K3_ASSIGN_OR_RETURN(std::unique_ptr<NodeEndpoints> endpoints,
                      NodeEndpoints::Start(std::move(endpoint_options)));
  p.endpoints = std::move(endpoints);
  p.ready_gauge =
      DefaultMetrics()
          .AddGauge("k3_attention_ready", "1 while the node admits Generate calls, else 0.")
          .Get();
  p.routers_gauge = DefaultMetrics()
                        .AddGauge("k3_attention_connected_routers",
                                  "Routers this node can send MoE layers to.")
                        .Get();
  if (p.remote_experts != nullptr) {
    p.device_layers = DefaultMetrics()
                          .AddCounter("k3_attention_device_moe_layers_total",
                                      "MoE layers sent GPU to GPU to the expert nodes.")
                          .Get();
    p.device_failures = DefaultMetrics()
                            .AddCounter("k3_attention_device_moe_failures_total",
                                        "MoE layers whose GPU-to-GPU path failed (each then went "
                                        "through the router tier).")
                            .Get();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::StartStandalone(
    const AttentionServerOptions& options, const ModelWeights* weights, RoutedMoe* routed_moe) {
  K3_RETURN_IF_ERROR(options.scheduler.Validate());
  std::unique_ptr<AttentionServer> node(new AttentionServer(std::make_unique<Parts>(options)));
  if (absl::Status s = node->StartServing(weights, routed_moe, pb::ROLE_UNSPECIFIED); !s.ok()) {
    return s;
  }
  node->parts_->serving = true;
  node->parts_->endpoints->SetReady(true);
  node->parts_->ready_gauge->Set(1);
  LOG(INFO) << "standalone attention server on port " << node->port();
  return node;
}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Start(
    const AttentionServerOptions& options) {
  K3_RETURN_IF_ERROR(options.scheduler.Validate());
  std::unique_ptr<AttentionServer> node(new AttentionServer(std::make_unique<Parts>(options)));
  Parts& p = *node->parts_;

  const absl::Time load_start = absl::Now();
  WeightSelection selection = WeightSelection::AttentionOnly();
  // On a GPU the gate runs here too, for the MoE layers that go GPU to GPU (RemoteDeviceExperts).
  selection.router = options.device.cuda >= 0;
  K3_ASSIGN_OR_RETURN(p.weights, LoadWeights(options.node.model, selection));
  LOG(INFO) << "attention weights of " << options.node.model << ": " << p.weights->selected_bytes
            << " bytes, loaded in " << absl::FormatDuration(absl::Now() - load_start);

  K3_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> transport, CreateNodeTransport(options.node));
  p.transport = std::move(transport);
  p.links = std::make_unique<PeerLinks>(p.transport.get());
  RemoteRoutedMoeOptions moe_options;
  moe_options.timeout = options.moe_timeout;
  moe_options.retry_floor = options.moe_retry_floor;
  moe_options.retry_p99_factor = options.moe_retry_p99_factor;
  PeerLinks* links = p.links.get();
  moe_options.on_router_failed = [links](PeerId router, const absl::Status& error) {
    links->MarkFailed(router, error);
  };
  p.remote_moe =
      std::make_unique<RemoteRoutedMoe>(p.transport.get(), p.weights->config, moe_options);
  pb::NodeInfo info;
  if (options.device.cuda >= 0) {
    // GPU to GPU to the expert nodes where the cluster allows (issue 21; docs/GPU.md).
    K3_ASSIGN_OR_RETURN(GpuChannelSetup setup, NcclChannelSetup(options.device.cuda));
    info.set_gpu_uuid(setup.gpu_uuid);
    p.device_channels = std::make_unique<DeviceChannels>(std::move(setup.opener));
    RemoteDeviceExpertsOptions experts_options;
    // A device layer that fails falls back to the router tier, which waits out lost nodes.
    experts_options.timeout = std::min(options.moe_timeout, absl::Seconds(10));
    RemoteRoutedMoe* remote_moe = p.remote_moe.get();
    experts_options.others = [remote_moe](Received event) { remote_moe->Deliver(std::move(event)); };
    p.remote_experts = std::make_unique<RemoteDeviceExperts>(
        p.transport.get(), p.device_channels.get(), p.weights->config, experts_options);
  }
  if (absl::Status s =
          node->StartServing(p.weights.get(), p.remote_moe.get(), pb::ROLE_ATTENTION);
      !s.ok()) {
    return s;
  }

  info.set_transport_address(p.transport->LocalAddress());
  p.watcher = std::make_unique<Actor>("attn-watcher");
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
  std::function<std::vector<uint64_t>()> take_broken;
  if (DeviceChannels* channels = p.device_channels.get()) {
    take_broken = [channels] { return channels->TakeBroken(); };
  }
  p.endpoints->Register(std::move(info), std::move(callbacks), std::move(take_broken));
  node->ScheduleTick();
  return node;
}

void AttentionServer::Tick() {
  Parts& p = *parts_;
  const absl::StatusOr<uint32_t> self = p.endpoints->client()->WaitRegistered(absl::InfinitePast());
  const pb::ClusterState state = p.endpoints->client()->cluster_state();
  if (p.first_tick || state.members_version() != p.seen_members_version) {
    p.first_tick = false;
    p.seen_members_version = state.members_version();
    p.routers = LinkTargets(state, {pb::ROLE_ROUTER}, self.ok() ? *self : 0);
    std::vector<PeerTarget> targets = p.routers;
    if (p.device_channels != nullptr) {
      // The expert nodes too: the device path's control messages go to them directly.
      for (PeerTarget& expert : LinkTargets(state, {pb::ROLE_EXPERT}, self.ok() ? *self : 0)) {
        targets.push_back(std::move(expert));
      }
    }
    p.links->SetTargets(std::move(targets));
  }
  if (p.device_channels != nullptr && self.ok()) {
    p.device_channels->Apply(state, *self);
    absl::StatusOr<ClusterPlacement> placement = ClusterPlacementFromProto(state.placement());
    if (placement.ok()) p.remote_experts->SetPlacement(*std::move(placement));
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
    p.endpoints->SetReady(serving);
    p.ready_gauge->Set(serving ? 1 : 0);
    LOG(INFO) << "attention node " << (self.ok() ? absl::StrCat(*self) : "?")
              << (serving ? absl::StrCat(" is ready with ", usable.size(), " router(s)")
                          : absl::StrCat(" is not ready: ", reason));
  }

  if (p.remote_experts != nullptr) {
    // The counts live in RemoteDeviceExperts (stepping thread); the counters catch up here.
    p.device_layers->Increment(static_cast<double>(p.remote_experts->layers_served()) -
                               p.device_layers->Value());
    p.device_failures->Increment(static_cast<double>(p.remote_experts->layers_failed()) -
                                 p.device_failures->Value());
  }
  const SchedulerInfo info = p.scheduler->Info();
  pb::LoadStats load;
  load.set_active_requests(info.active_requests);
  load.set_queued_items(info.active_requests - info.cached_sequences);
  load.set_state_bytes(info.state_bytes);
  p.endpoints->client()->SetLoad(load);
}

void AttentionServer::ScheduleTick() {
  parts_->watcher->PostAfter(kTickInterval, [this] {
    Tick();
    ScheduleTick();
  });
}

void AttentionServer::DrainAsync(absl::Time deadline, std::function<void(int left)> done) {
  Parts& p = *parts_;
  if (!p.draining.exchange(true)) LOG(INFO) << "draining: no new requests are admitted";
  p.scheduler->StopAdmitting();
  p.endpoints->SetReady(false);
  p.ready_gauge->Set(0);
  GenerationScheduler* scheduler = p.scheduler.get();
  scheduler->NotifyWhenIdle(deadline, [scheduler, done = std::move(done)](bool idle) {
    if (idle) {
      done(0);
      return;
    }
    const int left = scheduler->Info().active_requests;
    LOG(WARNING) << "drain deadline passed with " << left << " request(s) running; cancelling them";
    scheduler->CancelAll(absl::UnavailableError(
        "the server is shutting down: its drain deadline passed"));
    done(left);
  });
}

int AttentionServer::Drain(absl::Time deadline) {
  absl::Notification drained;
  int left = 0;
  DrainAsync(deadline, [&](int n) {
    left = n;
    drained.Notify();
  });
  drained.WaitForNotification();
  return left;
}

void AttentionServer::Shutdown() {
  Parts& p = *parts_;
  if (p.shut_down) return;
  p.shut_down = true;
  if (p.endpoints != nullptr && p.scheduler != nullptr) {
    Drain(absl::Now() + p.options.drain_timeout);
  }
  // The watcher first: it uses everything below.
  if (p.watcher) p.watcher->Stop();
  if (p.scheduler) p.scheduler->Shutdown();
  StopDataPlane(p.endpoints.get(), p.links.get(), p.transport.get());
}

void AddAttentionFlags(CLI::App* app, AttentionServerOptions* options) {
  AddNodeFlags(app, &options->node);
  AddGenerateServingFlags(app, options);
  constexpr int64_t kMaxMs = 24 * 3600 * 1000;
  AddMilliseconds(app, "--moe-timeout-ms", &options->moe_timeout, 1, kMaxMs,
                  "how long a MoE layer may take, sent again to another router, or to the same "
                  "one once it or its expert worker is back (restarted, resumed): how long a "
                  "step's sequences wait out a lost node before they fail");
  AddMilliseconds(app, "--moe-retry-floor-ms", &options->moe_retry_floor, 1, kMaxMs,
                  "the least a MoE layer waits for a router before it goes to another one");
  AddBoundedInt(app, "--moe-retry-p99-factor", &options->moe_retry_p99_factor, 1, 1000,
                "a MoE layer goes to another router after this many times the p99 round trip "
                "(or the floor)");
}

void AddGenerateServingFlags(CLI::App* app, AttentionServerOptions* options) {
  SchedulerOptions& s = options->scheduler;
  constexpr int64_t kMaxMs = 24 * 3600 * 1000;
  AddBoundedInt(app, "--max-batch-tokens", &s.max_batch_tokens, 1, 1 << 20,
                "tokens one step computes at most");
  AddMilliseconds(app, "--step-target-ms", &s.step_target, 0, kMaxMs,
                  "while streams decode, the step time the prompt budget aims at (0: "
                  "--step-target-factor x a one-token step, measured)");
  app->add_option("--step-target-factor", s.step_target_factor,
                  "with --step-target-ms 0: the step time target as a multiple of a one-token "
                  "step's (>= 1)")
      ->check(CLI::Range(1.0, 1000.0));
  AddMilliseconds(app, "--ttft-target-ms", &s.ttft_target, 1, kMaxMs,
                  "once the oldest prompt has waited longer, prompts get proportionally more of "
                  "each step");
  AddBoundedInt(app, "--min-prefill-tokens", &s.min_prefill_chunk, 1, 1 << 20,
                "prompt tokens a step takes at least while prompts wait");
  AddBoundedInt(app, "--prefix-cache-bytes", &s.prefix_cache_bytes, 0, int64_t{1} << 50,
                "memory for cached conversation prefixes (MLA pages, KDA state snapshots), "
                "least recently used evicted; 0: no prefix cache");
  AddBoundedInt(app, "--prefix-block-tokens", &s.prefix_block_tokens, 16, 1 << 20,
                "prefix cache block: a hit resumes at a multiple of it (a multiple of 16)");
  AddBoundedInt(app, "--max-sequences", &s.max_sequences, 1, 1 << 16,
                "requests held at once (state in memory)");
  AddBoundedInt(app, "--max-new-tokens-limit", &s.max_new_tokens_limit, 1, 1 << 24,
                "the most new tokens a request may ask for");
  AddBoundedInt(app, "--max-prompt-tokens", &s.max_prompt_tokens, 1, 1 << 24,
                "the longest prompt admitted");
  app->add_option("--ping-pong", s.ping_pong,
                  "steps of two or more sequences as two micro-batches that take turns, one "
                  "computing attention while the other's MoE layer is at the routers: auto "
                  "(whichever is measured faster), on, off")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, PingPong>{
              {"auto", PingPong::kMeasured}, {"on", PingPong::kAlways}, {"off", PingPong::kOff}},
          CLI::ignore_case))
      ->default_str("auto");
  AddMilliseconds(app, "--drain-timeout-ms", &options->drain_timeout, 0, kMaxMs,
                  "at shutdown, how long requests in flight may finish");
  app->add_option("--auth-token-file", options->auth_token_file,
                  "file holding the bearer token every K3Serve call must send "
                  "(authorization: Bearer <token>); health checks stay open");
  AddBoundedInt(app, "--max-request-bytes", &options->max_request_bytes, 1024, 1 << 30,
                "the largest request message accepted (RESOURCE_EXHAUSTED beyond)");
  AddDeviceFlag(app, &options->device,
                "where the forward pass runs: cpu (default), cuda or cuda:N (BF16 non-expert "
                "weights and every sequence's state on that GPU; docs/GPU.md)");
  AddBoundedInt(app, "--gpu-cache-pages", &options->gpu_cache_pages, 0, INT32_MAX,
                "with --device cuda: MLA cache pages of 64 tokens (0: --max-sequences x "
                "(--max-prompt-tokens + --max-new-tokens-limit))");
  AddBoundedInt(app, "--max-streams-per-client", &options->max_streams_per_client, 0, 1 << 20,
                "Generate streams in flight per client address (RESOURCE_EXHAUSTED beyond; "
                "0: no limit)");
}

int RunAttentionNode(const AttentionServerOptions& options) {
  return RunProcessNode<AttentionServer>("attention node", options);  // Shutdown drains first
}

Subcommand AddAttentionCommand(CLI::App* top) {
  return AddSubcommand(top, "attention", "an attention worker: the public Generate API",
                       AddAttentionFlags, RunAttentionNode);
}

}  // namespace k3
