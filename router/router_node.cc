#include "router/router_node.h"

#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/coordinator_client.h"
#include "cluster/grpc_server.h"
#include "cluster/grpc_status.h"
#include "cluster/metrics.h"
#include "cluster/ucx_transport.h"
#include "glog/logging.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "cluster/node_process.h"
#include "cluster/peer_links.h"
#include "router/router_core.h"
#include "tools/cli_flags.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kServiceName[] = "k3serve.cluster.v1.RouterControl";
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

class RouterControlService final : public pb::RouterControl::Service {
 public:
  explicit RouterControlService(RouterCore* core) : core_(core) {}

  ::grpc::Status GetLoadStats(::grpc::ServerContext*, const pb::GetLoadStatsRequest* request,
                              pb::LoadStatsResponse* response) override {
    if (request->version_only()) {
      response->set_placement_version(core_->placement_version());
    } else {
      *response = core_->LoadStats(request->reset());
    }
    return ::grpc::Status::OK;
  }

  ::grpc::Status SetBias(::grpc::ServerContext*, const pb::SetBiasRequest* request,
                         pb::SetBiasResponse*) override {
    return ToGrpcStatus(core_->SetBias(
        request->layer(), std::vector<float>(request->values().begin(), request->values().end())));
  }

 private:
  RouterCore* const core_;
};

class RouterNode {
 public:
  explicit RouterNode(RouterNodeOptions options) : options_(std::move(options)) {}

  absl::Status Start();
  absl::Status Run(StopSignals* signals);
  void Shutdown();

 private:
  const RouterNodeOptions options_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<RouterControlService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsHttpServer> http_;
  // Loop thread only.
  uint32_t node_id_ = 0;
  std::string name_ = "router node (unregistered)";
  // Last: its thread calls back into the members above until it stops.
  std::unique_ptr<CoordinatorClient> client_;
};

absl::Status RouterNode::Start() {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(options_.model);
  if (!checkpoint.ok()) return checkpoint.status();
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadWeights(std::move(*checkpoint), WeightSelection::RouterOnly());
  if (!weights.ok()) return weights.status();
  weights_ = *std::move(weights);
  LOG(INFO) << "router weights of " << options_.model << ": " << weights_->selected_bytes
            << " bytes, loaded in " << absl::FormatDuration(absl::Now() - load_start);

  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create();
  if (!transport.ok()) return transport.status();
  transport_ = *std::move(transport);
  links_ = std::make_unique<PeerLinks>(transport_.get());
  RouterCoreOptions core_options;
  core_options.step_timeout = options_.step_timeout;
  core_options.qb_bins = options_.qb_bins;
  absl::StatusOr<std::unique_ptr<RouterCore>> core = RouterCore::Create(
      weights_.get(), transport_.get(), links_.get(), core_options, &DefaultMetrics());
  if (!core.ok()) return core.status();
  core_ = *std::move(core);
  service_ = std::make_unique<RouterControlService>(core_.get());

  GrpcServerOptions server_options;
  server_options.address = HostPort(options_.host, options_.port);
  server_options.health_services = {kServiceName};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(server_options, {service_.get()});
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  server_->SetServing("", true);

  const std::string advertised = AdvertisedHost(options_.host);
  pb::NodeInfo node;
  node.set_role(pb::ROLE_ROUTER);
  node.set_grpc_address(HostPort(advertised, server_->port()));
  node.set_transport_address(transport_->LocalAddress());
  if (options_.metrics_port >= 0) {
    MetricsHttpOptions http_options;
    http_options.host = options_.host;
    http_options.port = options_.metrics_port;
    RouterCore* core_ptr = core_.get();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
        http_options, &DefaultMetrics(), [core_ptr] { return core_ptr->Readiness(); });
    if (!http.ok()) return http.status();
    http_ = *std::move(http);
    node.set_metrics_address(HostPort(advertised, http_->port()));
  }

  CoordinatorClientOptions client_options;
  client_options.coordinator_address = options_.coordinator;
  client_options.node = node;
  CoordinatorCallbacks callbacks;
  callbacks.on_cluster_state = [this](const pb::ClusterState& state) {
    core_->UpdateClusterState(state);
    links_->SetTargets(LinkTargets(state, {pb::ROLE_ATTENTION, pb::ROLE_EXPERT}, /*self=*/0));
  };
  client_ = std::make_unique<CoordinatorClient>(std::move(client_options), std::move(callbacks));
  client_->Start();
  LOG(INFO) << "router serving gRPC on " << node.grpc_address()
            << (http_ ? absl::StrCat(", metrics on port ", http_->port()) : "")
            << "; registering with the coordinator at " << options_.coordinator;
  return absl::OkStatus();
}

absl::Status RouterNode::Run(StopSignals* signals) {
  bool serving = false;
  for (;;) {
    if (const int signal_number = signals->Poll(); signal_number != 0) {
      LOG(INFO) << name_ << " got signal " << signal_number << "; shutting down";
      return absl::OkStatus();
    }
    if (absl::StatusOr<uint32_t> id = client_->WaitRegistered(absl::InfinitePast());
        id.ok() && *id != node_id_) {
      node_id_ = *id;
      name_ = absl::StrCat("router node ", node_id_);
    }
    absl::Status polled = core_->Poll(absl::Now() + kPollInterval);
    if (polled.code() == absl::StatusCode::kCancelled) return polled;
    const absl::Status ready = core_->Readiness();
    if (ready.ok() != serving) {
      serving = ready.ok();
      server_->SetServing(kServiceName, serving);
      LOG(INFO) << name_ << (serving ? " is ready" : absl::StrCat(" is not ready: ", ready.message()));
    }
  }
}

void RouterNode::Shutdown() {
  if (server_) server_->SetServing(kServiceName, false);
  if (core_) core_->FailAll(absl::UnavailableError(absl::StrCat(name_, " is shutting down")));
  if (client_) client_->Stop();
  if (links_) links_->Stop();
  if (transport_) transport_->Close();
  if (http_) http_->Stop();
  if (server_) server_->Shutdown(absl::Seconds(1));
}

int Fail(const absl::Status& status) {
  std::cerr << "k3serve router: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

absl::StatusOr<RouterNodeOptions> ParseRouterNodeArgs(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(
      args, CliFlags::WithNodeFlags({"step-timeout-ms", "qb-bins"}));
  if (!flags.ok()) return flags.status();
  RouterNodeOptions options;
  NodeFlags node;
  node.host = options.host;
  if (absl::Status s = flags->ReadNodeFlags(&node); !s.ok()) return s;
  options.coordinator = node.coordinator;
  options.model = node.model;
  options.host = node.host;
  options.port = node.port;
  options.metrics_port = node.metrics_port;
  absl::StatusOr<int64_t> timeout_ms = flags->Int("step-timeout-ms", 5000);
  if (!timeout_ms.ok()) return timeout_ms.status();
  if (*timeout_ms < 1 || *timeout_ms > 3600 * 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step-timeout-ms is ", *timeout_ms, "; must be in [1, 3600000]"));
  }
  options.step_timeout = absl::Milliseconds(*timeout_ms);
  absl::StatusOr<int64_t> bins = flags->Int("qb-bins", options.qb_bins);
  if (!bins.ok()) return bins.status();
  if (*bins < 0 || *bins > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--qb-bins is ", *bins, "; must be in [0, 100000]"));
  }
  options.qb_bins = static_cast<int>(*bins);
  return options;
}

int RunRouterNode(const std::vector<std::string>& args) {
  absl::StatusOr<RouterNodeOptions> options = ParseRouterNodeArgs(args);
  if (!options.ok()) return Fail(options.status());
  StopSignals signals;  // before any thread starts
  RouterNode node(*std::move(options));
  absl::Status status = node.Start();
  if (status.ok()) status = node.Run(&signals);
  node.Shutdown();
  if (!status.ok()) {
    LOG(ERROR) << "router node: " << status;
    return 1;
  }
  return 0;
}

}  // namespace k3
