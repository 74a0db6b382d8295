#include "router/router_node.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/actor.h"
#include "cluster/actor_rpc.h"
#include "cluster/node_runtime.h"
#include "cluster/metrics.h"
#include "cluster/span_log.h"
#include "cluster/node_transport.h"
#include "cluster/ucx_transport.h"
#include "glog/logging.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "cluster/peer_links.h"
#include "router/router_core.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kServiceName[] = "k3serve.cluster.v1.RouterControl";
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

// The RouterControl RPCs, carried out on the router's actor (RunOnActor: no gRPC thread waits).
class RouterControlService final : public pb::RouterControl::CallbackService {
 public:
  RouterControlService(RouterCore* core, Actor* actor) : core_(core), actor_(actor) {}

  grpc::ServerUnaryReactor* GetLoadStats(grpc::CallbackServerContext* context,
                                         const pb::GetLoadStatsRequest* request,
                                         pb::LoadStatsResponse* response) override {
    RouterCore* core = core_;
    return RunOnActor(*actor_, context, [core, request, response] {
      *response = core->LoadStats(request->reset());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* SetBias(grpc::CallbackServerContext* context,
                                    const pb::SetBiasRequest* request,
                                    pb::SetBiasResponse*) override {
    RouterCore* core = core_;
    return RunOnActor(*actor_, context, [core, request] {
      return core->SetBias(request->layer(),
                           std::vector<float>(request->values().begin(), request->values().end()));
    });
  }

 private:
  RouterCore* const core_;
  Actor* const actor_;
};

class RouterNode final : public RoleHooks {
 public:
  explicit RouterNode(RouterNodeOptions options) : options_(std::move(options)) {}

  absl::Status Start() override;
  absl::Status Failure() override {
    absl::MutexLock lock(&failure_mu_);
    return failure_;
  }
  void Shutdown() override;

 private:
  // One turn of the data plane on the actor: steps in, requests out, answers back. Posts itself
  // again, so that the other messages of the mailbox run between turns.
  void Pump();

  const RouterNodeOptions options_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<SpanLog> spans_;  // with --trace-file; outlives core_
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<Actor> actor_;
  std::unique_ptr<RouterControlService> service_;
  std::unique_ptr<NodeEndpoints> endpoints_;

  // Actor thread only.
  uint32_t node_id_ = 0;
  std::string name_ = "router node (unregistered)";
  bool serving_ = false;
  absl::Status last_ready_ = absl::UnavailableError("starting");

  // The core's readiness as of the actor's last turn, for /healthz (the metrics server's thread).
  absl::Mutex ready_mu_;
  absl::Status ready_ ABSL_GUARDED_BY(ready_mu_) = absl::UnavailableError("starting");

  absl::Mutex failure_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
};

absl::Status RouterNode::Start() {
  const absl::Time load_start = absl::Now();
  K3_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                      LoadWeights(options_.node.model, WeightSelection::RouterOnly()));
  weights_ = std::move(weights);
  LOG(INFO) << "router weights of " << options_.node.model << ": " << weights_->selected_bytes
            << " bytes, loaded in " << absl::FormatDuration(absl::Now() - load_start);

  K3_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> transport, CreateNodeTransport(options_.node));
  transport_ = std::move(transport);
  links_ = std::make_unique<PeerLinks>(transport_.get());
  RouterCoreOptions core_options;
  core_options.step_timeout = options_.step_timeout;
  core_options.expert_retry_floor = options_.expert_retry_floor;
  core_options.expert_retry_p99_factor = options_.expert_retry_p99_factor;
  core_options.per_expert_metrics = options_.per_expert_metrics;
  core_options.qb_bins = options_.qb_bins;
  if (!options_.node.trace_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<SpanLog> spans,
                        SpanLog::Open(options_.node.trace_file, "router"));
    spans_ = std::move(spans);
    core_options.spans = spans_.get();
  }
  K3_ASSIGN_OR_RETURN(std::unique_ptr<RouterCore> core,
                      RouterCore::Create(weights_.get(), transport_.get(), links_.get(),
                                         core_options, &DefaultMetrics()));
  core_ = std::move(core);
  actor_ = std::make_unique<Actor>("router");
  service_ = std::make_unique<RouterControlService>(core_.get(), actor_.get());

  NodeEndpointsOptions endpoint_options;
  endpoint_options.flags = options_.node;
  endpoint_options.role = pb::ROLE_ROUTER;
  endpoint_options.readiness_service = kServiceName;
  endpoint_options.services = {service_.get()};
  endpoint_options.readiness = [this] {
    absl::MutexLock lock(&ready_mu_);
    return ready_;
  };
  K3_ASSIGN_OR_RETURN(std::unique_ptr<NodeEndpoints> endpoints,
                      NodeEndpoints::Start(std::move(endpoint_options)));
  endpoints_ = std::move(endpoints);

  pb::NodeInfo node;
  node.set_transport_address(transport_->LocalAddress());
  CoordinatorCallbacks callbacks;
  callbacks.on_cluster_state = [this](const pb::ClusterState& state) {
    actor_->Post([this, state] {
      core_->UpdateClusterState(state);
      // The coordinator learns of the switch from this (PlacementRollout waits for it).
      endpoints_->client()->SetAppliedPlacementVersion(core_->placement_version());
      links_->SetTargets(LinkTargets(state, {pb::ROLE_ATTENTION, pb::ROLE_EXPERT}, /*self=*/0));
    });
  };
  endpoints_->Register(std::move(node), std::move(callbacks));
  actor_->Post([this] { Pump(); });
  return absl::OkStatus();
}

void RouterNode::Pump() {
  if (absl::StatusOr<uint32_t> id = endpoints_->client()->WaitRegistered(absl::InfinitePast());
      id.ok() && *id != node_id_) {
    node_id_ = *id;
    name_ = absl::StrCat("router node ", node_id_);
  }
  absl::Status polled = core_->Poll(absl::Now() + kPollInterval);
  if (polled.code() == absl::StatusCode::kCancelled) {
    absl::MutexLock lock(&failure_mu_);
    failure_ = polled;
    return;  // the transport is gone: no more turns
  }
  const absl::Status ready = core_->Readiness();
  if (ready != last_ready_) {
    last_ready_ = ready;
    absl::MutexLock lock(&ready_mu_);
    ready_ = ready;
  }
  if (ready.ok() != serving_) {
    serving_ = ready.ok();
    endpoints_->SetReady(serving_);
    LOG(INFO) << name_
              << (serving_ ? " is ready" : absl::StrCat(" is not ready: ", ready.message()));
  }
  actor_->Post([this] { Pump(); });
}

void RouterNode::Shutdown() {
  if (endpoints_) endpoints_->SetReady(false);
  if (actor_) {
    // The steps in flight get their answer before the node leaves; then the mailbox closes.
    // ABORTED: the attention workers send those layers to another router (remote_routed_moe.h).
    const auto fail_all = [this] {
      core_->FailAll(absl::AbortedError(absl::StrCat(name_, " is shutting down")));
    };
    actor_->Call(fail_all, absl::Now() + absl::Seconds(2)).IgnoreError();
    actor_->Stop();
  }
  StopDataPlane(endpoints_.get(), links_.get(), transport_.get());
}

}  // namespace

void AddRouterNodeFlags(CLI::App* app, RouterNodeOptions* options) {
  AddNodeFlags(app, &options->node);
  AddMilliseconds(app, "--step-timeout-ms", &options->step_timeout, 1, 3600 * 1000,
                  "how long a MoE step waits for its expert workers");
  AddMilliseconds(app, "--expert-retry-floor-ms", &options->expert_retry_floor, 1, 3600 * 1000,
                  "with replicas, the least a step waits for an expert worker before its rows go "
                  "to a replica");
  AddBoundedInt(app, "--expert-retry-p99-factor", &options->expert_retry_p99_factor, 1, 1000,
                "with replicas, rows go to a replica after this many times the p99 expert round "
                "trip (or the floor)");
  AddBoundedInt(app, "--qb-bins", &options->qb_bins, 0, 100000,
                "bins of the QB load histograms (0: token counts only)");
  app->add_flag("--per-expert-metrics", options->per_expert_metrics,
                "export k3_router_expert_routed_tokens_total{expert} (one series per expert id)");
}

Subcommand AddRouterNodeCommand(CLI::App* top) {
  return AddNodeSubcommand<RouterNode>(
      top, "router", "a router: gate, dispatch and combine of MoE layers", AddRouterNodeFlags);
}

}  // namespace k3
