#include "coordinator/coordinator_main.h"

#include <pthread.h>
#include <signal.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/coordinator_service.h"
#include "cluster/grpc_server.h"
#include "cluster/metrics.h"
#include "glog/logging.h"
#include "model/config.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kCoordinatorServiceName[] = "k3serve.cluster.v1.Coordinator";

absl::Status BadFlag(const std::string& flag, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", why));
}

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int min, int max) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v)) return BadFlag(flag, value, "not an integer");
  if (v < min || v > max) {
    return BadFlag(flag, value, absl::StrCat("must be in [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<double> ParseFraction(const std::string& flag, const std::string& value) {
  double v = 0;
  if (!absl::SimpleAtod(value, &v)) return BadFlag(flag, value, "not a number");
  if (!(v >= 0 && v < 1)) return BadFlag(flag, value, "must be in [0, 1)");
  return v;
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

std::string HostPort(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<CoordinatorMainOptions> ParseCoordinatorArgs(const std::vector<std::string>& args) {
  CoordinatorMainOptions options;
  CoordinatorOptions& c = options.coordinator;
  std::string model;
  int num_experts = -1;
  int num_moe_layers = -1;
  std::string roles;
  constexpr int kMaxMs = 24 * 3600 * 1000;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string flag = arg.substr(2);
    std::string value;
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs a value"));
    }
    absl::StatusOr<int> v = 0;
    if (flag == "port" || flag == "metrics-port") {
      v = ParseInt(flag, value, 0, 65535);
      if (v.ok()) (flag == "port" ? options.port : options.metrics_port) = *v;
    } else if (flag == "host") {
      if (value.empty()) return BadFlag(flag, value, "empty");
      options.host = value;
    } else if (flag == "model") {
      model = value;
    } else if (flag == "num-experts") {
      v = ParseInt(flag, value, 0, 1 << 20);
      if (v.ok()) num_experts = *v;
    } else if (flag == "num-moe-layers") {
      v = ParseInt(flag, value, 0, 1 << 16);
      if (v.ok()) num_moe_layers = *v;
    } else if (flag == "expected-experts") {
      v = ParseInt(flag, value, 1, 1 << 16);
      if (v.ok()) c.expected_expert_nodes = *v;
    } else if (flag == "required-roles") {
      roles = value;
    } else if (flag == "heartbeat-interval-ms") {
      v = ParseInt(flag, value, 1, kMaxMs);
      if (v.ok()) c.heartbeat_interval = absl::Milliseconds(*v);
    } else if (flag == "heartbeat-timeout-ms") {
      v = ParseInt(flag, value, 1, kMaxMs);
      if (v.ok()) c.heartbeat_timeout = absl::Milliseconds(*v);
    } else if (flag == "recovery-window-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) c.recovery_window = absl::Milliseconds(*v);
    } else if (flag == "shutdown-grace-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) options.shutdown_grace = absl::Milliseconds(*v);
    } else if (flag == "load-stats-interval-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) options.balancing.gather_interval = absl::Milliseconds(*v);
    } else if (flag == "rebalance-interval-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) options.balancing.rebalance_interval = absl::Milliseconds(*v);
    } else if (flag == "spare-slots-per-worker") {
      v = ParseInt(flag, value, 0, 1 << 20);
      if (v.ok()) options.balancing.spare_slots_per_worker = *v;
    } else if (flag == "rebalance-min-improvement") {
      absl::StatusOr<double> fraction = ParseFraction(flag, value);
      if (!fraction.ok()) return fraction.status();
      options.balancing.min_improvement = *fraction;
    } else if (flag == "retire-delay-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) options.balancing.retire_delay = absl::Milliseconds(*v);
    } else if (flag == "online-bias-interval-ms") {
      v = ParseInt(flag, value, 0, kMaxMs);
      if (v.ok()) options.balancing.online_bias_interval = absl::Milliseconds(*v);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag));
    }
    if (!v.ok()) return v.status();
  }

  if (!model.empty()) {
    absl::StatusOr<ModelConfig> config = ResolveModel(model);
    if (!config.ok()) return config.status();
    c.num_experts = config->num_experts;
    c.num_moe_layers = config->num_experts > 0 ? config->NumMoeLayers() : 0;
  }
  if (num_experts >= 0) c.num_experts = num_experts;
  if (num_moe_layers >= 0) c.num_moe_layers = num_moe_layers;
  if (c.num_experts == 0 && model.empty() && num_experts < 0) {
    return absl::InvalidArgumentError("give --model or --num-experts and --num-moe-layers");
  }
  if (roles.empty()) {
    c.required_roles = {pb::ROLE_ATTENTION, pb::ROLE_ROUTER};
    if (c.num_experts > 0) c.required_roles.push_back(pb::ROLE_EXPERT);
  } else {
    c.required_roles.clear();
    for (const std::string& name : std::vector<std::string>(absl::StrSplit(roles, ','))) {
      absl::StatusOr<pb::Role> role = ParseRole(name);
      if (!role.ok()) return role.status();
      c.required_roles.push_back(*role);
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (absl::Status s = options.balancing.Validate(); !s.ok()) return s;
  if (c.num_experts == 0 && (options.balancing.rebalance_interval > absl::ZeroDuration() ||
                             options.balancing.online_bias_interval > absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "--rebalance-interval-ms and --online-bias-interval-ms need a model with routed experts");
  }
  return options;
}

struct CoordinatorProcess::Parts {
  absl::Duration grace;
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<GrpcServer> server;
  std::unique_ptr<MetricsHttpServer> http;
  bool shut_down = false;
};

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const CoordinatorMainOptions& options) {
  if (absl::Status s = options.coordinator.Validate(); !s.ok()) return s;
  if (absl::Status s = options.balancing.Validate(); !s.ok()) return s;
  auto parts = std::make_unique<Parts>();
  parts->grace = options.shutdown_grace;
  parts->service = std::make_unique<CoordinatorService>(options.coordinator, &DefaultMetrics(),
                                                        options.balancing);
  GrpcServerOptions server_options;
  server_options.address = HostPort(options.host, options.port);
  server_options.health_services = {kCoordinatorServiceName};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(server_options, {parts->service.get()});
  if (!server.ok()) return server.status();
  parts->server = *std::move(server);
  if (options.metrics_port >= 0) {
    MetricsHttpOptions http_options;
    http_options.host = options.host;
    http_options.port = options.metrics_port;
    CoordinatorService* service = parts->service.get();
    // Liveness: the actor answers.
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(http_options, &DefaultMetrics(), [service] {
          return service->ClusterStateSnapshot(absl::Now() + absl::Seconds(1)).status();
        });
    if (!http.ok()) return http.status();
    parts->http = *std::move(http);
  }
  parts->server->SetServing("", true);
  parts->server->SetServing(kCoordinatorServiceName, true);
  LOG(INFO) << "coordinator serving gRPC on port " << parts->server->port()
            << (parts->http ? absl::StrCat(", metrics on port ", parts->http->port()) : "")
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

int CoordinatorProcess::port() const { return parts_->server->port(); }

int CoordinatorProcess::metrics_port() const { return parts_->http ? parts_->http->port() : -1; }

void CoordinatorProcess::Shutdown() {
  if (parts_->shut_down) return;
  parts_->shut_down = true;
  if (parts_->http) parts_->http->Stop();
  parts_->service->StopBalancing();  // a rollout in progress must not hold the server up
  parts_->server->Shutdown(parts_->grace);
  parts_->service.reset();
}

int RunCoordinator(const CoordinatorMainOptions& options) {
  // Block the signals before any server thread exists so that every thread inherits the mask
  // and sigwait below is the only place they land.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &signals, &previous);
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> process = CoordinatorProcess::Start(options);
  if (!process.ok()) {
    LOG(ERROR) << "coordinator did not start: " << process.status();
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return 1;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LOG(INFO) << "coordinator got signal " << signal_number << "; shutting down";
  (*process)->Shutdown();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return 0;
}

}  // namespace k3
