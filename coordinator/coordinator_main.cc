#include "coordinator/coordinator_main.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "cluster/node_runtime.h"
#include "cluster/metrics.h"
#include "cluster/nccl_unique_id.h"
#include "glog/logging.h"
#include "model/config.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kCoordinatorServiceName[] = "k3serve.cluster.v1.Coordinator";

absl::Status BadFlag(const std::string& flag, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", why));
}

absl::StatusOr<pb::Role> ParseRole(const std::string& name) {
  if (name == "attention") return pb::ROLE_ATTENTION;
  if (name == "router") return pb::ROLE_ROUTER;
  if (name == "expert") return pb::ROLE_EXPERT;
  return BadFlag("required-roles", name, "roles are attention, router and expert");
}

// A named test config, else a config.json file or a folder holding one.
absl::StatusOr<ModelConfig> ResolveModel(const std::string& model) {
  absl::StatusOr<ModelConfig> named = NamedConfig(model);
  if (named.ok()) return named;
  absl::StatusOr<ModelConfig> loaded = LoadModelConfig(model);
  if (loaded.ok()) return loaded;
  return BadFlag("model", model,
                 absl::StrCat("neither a named config (", named.status().message(),
                              ") nor a readable config (", loaded.status().message(), ")"));
}

// The flags resolved once parsing ends: they depend on each other.
struct ModelFlags {
  std::string model;
  int num_experts = -1;
  int num_moe_layers = -1;
  std::string roles;
};

absl::Status Resolve(const ModelFlags& flags, CoordinatorMainOptions* options) {
  CoordinatorOptions& c = options->coordinator;
  if (!flags.model.empty()) {
    K3_ASSIGN_OR_RETURN(ModelConfig config, ResolveModel(flags.model));
    c.num_experts = config.num_experts;
    c.num_moe_layers = config.num_experts > 0 ? config.NumMoeLayers() : 0;
  }
  // Spare slots hold replicas from the start (failover), and hot replicas after a rebalance.
  c.replica_slots_per_worker = options->balancing.spare_slots_per_worker;
  if (flags.num_experts >= 0) c.num_experts = flags.num_experts;
  if (flags.num_moe_layers >= 0) c.num_moe_layers = flags.num_moe_layers;
  if (c.num_experts == 0 && flags.model.empty() && flags.num_experts < 0) {
    return absl::InvalidArgumentError("give --model or --num-experts and --num-moe-layers");
  }
  if (flags.roles.empty()) {
    c.required_roles = {pb::ROLE_ATTENTION, pb::ROLE_ROUTER};
    if (c.num_experts > 0) c.required_roles.push_back(pb::ROLE_EXPERT);
  } else {
    c.required_roles.clear();
    for (const std::string& name : std::vector<std::string>(absl::StrSplit(flags.roles, ','))) {
      K3_ASSIGN_OR_RETURN(pb::Role role, ParseRole(name));
      c.required_roles.push_back(role);
    }
  }
  K3_RETURN_IF_ERROR(c.Validate());
  K3_RETURN_IF_ERROR(options->balancing.Validate());
  if (c.num_experts == 0 && (options->balancing.rebalance_interval > absl::ZeroDuration() ||
                             options->balancing.online_bias_interval > absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "--rebalance-interval-ms and --online-bias-interval-ms need a model with routed experts");
  }
  return absl::OkStatus();
}

}  // namespace

void AddCoordinatorFlags(CLI::App* app, CoordinatorMainOptions* options) {
  auto flags = std::make_shared<ModelFlags>();
  CoordinatorOptions& c = options->coordinator;
  LoadBalancerOptions& b = options->balancing;
  constexpr int64_t kMaxMs = 24 * 3600 * 1000;
  AddListenFlags(app, &options->node);
  app->add_option("--model", flags->model,
                  "a named test config, a config.json or a checkpoint folder: the expert counts");
  AddBoundedInt(app, "--num-experts", &flags->num_experts, 0, 1 << 20,
                "routed experts per MoE layer (instead of --model)");
  AddBoundedInt(app, "--num-moe-layers", &flags->num_moe_layers, 0, 1 << 16,
                "MoE layers (instead of --model)");
  AddBoundedInt(app, "--expected-experts", &c.expected_expert_nodes, 1, 1 << 16,
                "expert nodes the placement spreads the experts over");
  app->add_option("--required-roles", flags->roles,
                  "roles the cluster needs to be ready, e.g. attention,router,expert");
  AddMilliseconds(app, "--heartbeat-interval-ms", &c.heartbeat_interval, 1, kMaxMs,
                  "how often nodes report");
  AddMilliseconds(app, "--heartbeat-timeout-ms", &c.heartbeat_timeout, 1, kMaxMs,
                  "silence after which a node is DEAD");
  AddMilliseconds(app, "--recovery-window-ms", &c.recovery_window, 0, kMaxMs,
                  "how long a dead node's slot waits for it before a spare takes it");
  AddMilliseconds(app, "--shutdown-grace-ms", &options->shutdown_grace, 0, kMaxMs,
                  "for RPCs in flight at shutdown");
  AddMilliseconds(app, "--load-stats-interval-ms", &b.gather_interval, 0, kMaxMs,
                  "how often the routers' load statistics are gathered (0: never)");
  AddMilliseconds(app, "--rebalance-interval-ms", &b.rebalance_interval, 0, kMaxMs,
                  "how often experts are rebalanced (0: only on request)");
  AddBoundedInt(app, "--spare-slots-per-worker", &b.spare_slots_per_worker, 0, 1 << 20,
                "slots per expert worker kept for replicas");
  app->add_option("--rebalance-min-improvement", b.min_improvement,
                  "the smallest MaxVio gain worth a rollout")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  AddMilliseconds(app, "--retire-delay-ms", &b.retire_delay, 0, kMaxMs,
                  "how long an old placement's experts stay after a switch");
  AddMilliseconds(app, "--online-bias-interval-ms", &b.online_bias_interval, 0, kMaxMs,
                  "push the QB bias to the routers this often (0: off; changes outputs)");
  app->final_callback([flags, options] {
    if (absl::Status s = Resolve(*flags, options); !s.ok()) {
      throw CLI::ValidationError(std::string(s.message()));
    }
  });
}

absl::StatusOr<CoordinatorMainOptions> ParseCoordinatorArgs(const std::vector<std::string>& args) {
  return ParseFlags<CoordinatorMainOptions>(AddCoordinatorFlags, args);
}

struct CoordinatorProcess::Parts {
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<NodeEndpoints> endpoints;
  bool shut_down = false;
};

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const CoordinatorMainOptions& options) {
  K3_RETURN_IF_ERROR(options.coordinator.Validate());
  K3_RETURN_IF_ERROR(options.balancing.Validate());
  // The balancer calls the routers and expert workers with the node's TLS flags.
  LoadBalancerOptions balancing = options.balancing;
  K3_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(options.node.tls));
  balancing.tls = std::move(tls);
  CoordinatorOptions coordinator = options.coordinator;
  // Device channels need NCCL unique ids: where this build has NCCL, from it (no GPU needed).
  if (!coordinator.nccl_unique_id_generator) {
    coordinator.nccl_unique_id_generator = NcclUniqueIdSource();
  }
  auto parts = std::make_unique<Parts>();
  parts->service = std::make_unique<CoordinatorService>(coordinator, &DefaultMetrics(), balancing);
  NodeEndpointsOptions endpoint_options;
  endpoint_options.flags = options.node;
  endpoint_options.readiness_service = kCoordinatorServiceName;
  endpoint_options.services = {parts->service->grpc_service()};
  endpoint_options.shutdown_grace = options.shutdown_grace;
  CoordinatorService* service = parts->service.get();
  // Liveness: the actor answers.
  endpoint_options.readiness = [service] {
    return service->ClusterStateSnapshot(absl::Now() + absl::Seconds(1)).status();
  };
  K3_ASSIGN_OR_RETURN(std::unique_ptr<NodeEndpoints> endpoints,
                      NodeEndpoints::Start(std::move(endpoint_options)));
  parts->endpoints = std::move(endpoints);
  parts->endpoints->SetReady(true);
  LOG(INFO) << "coordinator serving gRPC on port " << parts->endpoints->port()
            << (parts->endpoints->metrics_port() >= 0
                    ? absl::StrCat(", metrics on port ", parts->endpoints->metrics_port())
                    : "")
            << "; " << options.coordinator.num_experts << " experts in "
            << options.coordinator.num_moe_layers << " MoE layers, waiting for "
            << options.coordinator.expected_expert_nodes << " expert nodes";
  if (options.balancing.online_bias_interval > absl::ZeroDuration()) {
    LOG(WARNING) << "online bias is on: the routers' e_score_correction_bias follows the QB "
                 << "estimate every "
                 << absl::FormatDuration(options.balancing.online_bias_interval)
                 << ", which changes the model's outputs";
  }
  return std::unique_ptr<CoordinatorProcess>(new CoordinatorProcess(std::move(parts)));
}

CoordinatorProcess::CoordinatorProcess(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

CoordinatorProcess::~CoordinatorProcess() { Shutdown(); }

int CoordinatorProcess::port() const { return parts_->endpoints->port(); }

int CoordinatorProcess::metrics_port() const { return parts_->endpoints->metrics_port(); }

void CoordinatorProcess::Shutdown() {
  if (parts_->shut_down) return;
  parts_->shut_down = true;
  parts_->service->StopBalancing();  // a rollout in progress must not hold the server up
  parts_->endpoints->Stop();
  parts_->service.reset();
}

int RunCoordinator(const CoordinatorMainOptions& options) {
  return RunProcessNode<CoordinatorProcess>("coordinator", options);
}

Subcommand AddCoordinatorCommand(CLI::App* top) {
  return AddSubcommand(top, "coordinator", "the coordinator: membership, placement, balancing",
                       AddCoordinatorFlags, RunCoordinator);
}

}  // namespace k3
