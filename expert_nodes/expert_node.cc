#include "expert_nodes/expert_node.h"

#include <algorithm>
#include <deque>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cluster/cluster_placement.h"
#include "cluster/coordinator_client.h"
#include "cluster/grpc_server.h"
#include "cluster/grpc_status.h"
#include "cluster/metrics.h"
#include "cluster/ucx_transport.h"
#include "expert_nodes/expert_worker.h"
#include "glog/logging.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "cluster/node_process.h"
#include "cluster/peer_links.h"
#include "tools/cli_flags.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kServiceName[] = "k3serve.cluster.v1.ExpertWorker";
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);
constexpr absl::Duration kGaugeInterval = absl::Seconds(1);
// How long a request sent under a placement this node has not seen yet waits for it: a router may
// learn of a new placement a heartbeat before the node it names does.
constexpr absl::Duration kDeferLimit = absl::Seconds(2);
// The longest a LoadExperts call waits for the serving thread (less when its deadline is sooner).
constexpr absl::Duration kMaxLoadWait = absl::Minutes(10);

// The Status RPC's answer, published by the serving thread.
class StatusBoard {
 public:
  void Set(pb::ExpertStatusResponse status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  void SetRows(int64_t rows) {
    absl::MutexLock lock(&mu_);
    status_.set_rows_processed(rows);
  }
  pb::ExpertStatusResponse Get() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable absl::Mutex mu_;
  pb::ExpertStatusResponse status_ ABSL_GUARDED_BY(mu_);
};

// LoadExperts requests handed from gRPC threads to the serving thread, which alone touches the
// worker.
class LoadQueue {
 public:
  struct Command {
    pb::LoadExpertsRequest request;
    absl::Status status;  // set before `done`
    absl::Notification done;
  };

  // Queues `request` and waits for the serving thread to carry it out, up to `deadline`.
  absl::Status Run(const pb::LoadExpertsRequest& request, absl::Time deadline) {
    auto command = std::make_shared<Command>();
    command->request = request;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return absl::UnavailableError("the expert node is shutting down");
      commands_.push_back(command);
    }
    if (!command->done.WaitForNotificationWithDeadline(deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "placement version ", request.placement_version(), " was not loaded in time"));
    }
    return command->status;
  }

  // The commands queued so far (serving thread).
  std::deque<std::shared_ptr<Command>> Take() {
    absl::MutexLock lock(&mu_);
    std::deque<std::shared_ptr<Command>> commands;
    commands.swap(commands_);
    return commands;
  }

  // Answers what is queued, and everything later, with UNAVAILABLE.
  void Close() {
    std::deque<std::shared_ptr<Command>> commands;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      commands.swap(commands_);
    }
    for (const auto& command : commands) {
      command->status = absl::UnavailableError("the expert node is shutting down");
      command->done.Notify();
    }
  }

 private:
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Command>> commands_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class ExpertWorkerService final : public pb::ExpertWorker::Service {
 public:
  ExpertWorkerService(const StatusBoard* board, LoadQueue* loads) : board_(board), loads_(loads) {}

  ::grpc::Status LoadExperts(::grpc::ServerContext* context, const pb::LoadExpertsRequest* request,
                             pb::LoadExpertsResponse* response) override {
    const absl::Time deadline =
        std::min(absl::FromChrono(context->deadline()), absl::Now() + kMaxLoadWait);
    const absl::Status status = loads_->Run(*request, deadline);
    if (status.ok()) response->set_placement_version(request->placement_version());
    return ToGrpcStatus(status);
  }

  ::grpc::Status Status(::grpc::ServerContext*, const pb::ExpertStatusRequest*,
                        pb::ExpertStatusResponse* response) override {
    *response = board_->Get();
    return ::grpc::Status::OK;
  }

 private:
  const StatusBoard* const board_;
  LoadQueue* const loads_;
};

struct NodeMetrics {
  explicit NodeMetrics(MetricsRegistry* r)
      : weight_bytes(r->AddGauge("k3_expert_weight_bytes",
                                 "Bytes of expert weights this node maps or owns").Get()),
        resident_bytes(r->AddGauge("k3_expert_resident_bytes",
                                   "Resident set size of the process").Get()),
        hosted_experts(r->AddGauge("k3_expert_hosted_experts",
                                   "Experts hosted, summed over MoE layers").Get()),
        rows(r->AddCounter("k3_expert_rows_total", "Rows computed").Get()),
        requests(r->AddCounter("k3_expert_requests_total", "ExpertRequests answered, by code",
                               {"code"})),
        seconds(r->AddHistogram("k3_expert_request_seconds", "Time to compute one ExpertRequest",
                                ExponentialBuckets(1e-5, 2, 20))
                    .Get()) {}

  Gauge* weight_bytes;
  Gauge* resident_bytes;
  Gauge* hosted_experts;
  Counter* rows;
  MetricFamily<Counter>& requests;
  Histogram* seconds;
};

class ExpertNode {
 public:
  explicit ExpertNode(ExpertNodeOptions options)
      : options_(std::move(options)), service_(&board_, &loads_), metrics_(&DefaultMetrics()) {}

  absl::Status Start();
  // Serves until a stop signal; an error when a placement's experts cannot be loaded.
  absl::Status Run(StopSignals* signals);
  void Shutdown();

 private:
  // Acts on the newest cluster state: loads the experts of a new placement when they changed.
  absl::Status MaybeReload();
  // Serves `hosting` from now on, with the experts of older versions still held (see Retain).
  absl::Status Load(ExpertHosting hosting);
  // Carries out the queued LoadExperts requests.
  void RunLoadCommands();
  absl::Status LoadExperts(const pb::LoadExpertsRequest& request);
  // Drops the versions no router may still use: those below retire_floor_, except the newest at
  // or below the published placement (the one in force as far as this node knows).
  void Retain();
  void PublishStatus();
  // Answers a request (see ExpertWorker::Handle for `may_defer`) and records it in the metrics.
  void Serve(const Received& received, bool may_defer);
  // Hands deferred requests to the current worker: all of them, or those past their limit.
  void ServeDeferred(bool all);

  const ExpertNodeOptions options_;
  StatusBoard board_;
  LoadQueue loads_;
  ExpertWorkerService service_;
  NodeMetrics metrics_;
  std::shared_ptr<const Checkpoint> checkpoint_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsHttpServer> http_;

  absl::Mutex mu_;
  pb::ClusterState state_ ABSL_GUARDED_BY(mu_);
  bool state_changed_ ABSL_GUARDED_BY(mu_) = false;

  // Serving thread only.
  uint32_t node_id_ = 0;
  std::string name_ = "expert node (unregistered)";
  std::unique_ptr<ExpertWorker> worker_;  // holds every placement version still in use
  int64_t published_ = 0;      // the newest placement version of the cluster state
  int64_t retire_floor_ = 0;   // versions below this one may go (see Retain)
  struct Deferred {
    Received received;
    absl::Time until;  // answered by whatever worker is current then
  };
  std::deque<Deferred> deferred_;

  // Last: its thread calls back into the members above until it stops.
  std::unique_ptr<CoordinatorClient> client_;
};

absl::Status ExpertNode::Start() {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(options_.model);
  if (!checkpoint.ok()) return checkpoint.status();
  checkpoint_ = *std::move(checkpoint);
  const ModelConfig& config = checkpoint_->config();
  if (config.num_experts == 0 || config.NumMoeLayers() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model in ", options_.model, " has no routed experts"));
  }
  worker_ = std::make_unique<ExpertWorker>(nullptr, ExpertHosting(), name_);

  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create();
  if (!transport.ok()) return transport.status();
  transport_ = *std::move(transport);
  links_ = std::make_unique<PeerLinks>(transport_.get());

  GrpcServerOptions server_options;
  server_options.address = HostPort(options_.host, options_.port);
  server_options.health_services = {kServiceName};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(server_options, {&service_});
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  server_->SetServing("", true);

  const std::string advertised = AdvertisedHost(options_.host);
  pb::NodeInfo node;
  node.set_role(pb::ROLE_EXPERT);
  node.set_grpc_address(HostPort(advertised, server_->port()));
  node.set_transport_address(transport_->LocalAddress());
  node.set_expert_slots(options_.slots);
  if (options_.metrics_port >= 0) {
    MetricsHttpOptions http_options;
    http_options.host = options_.host;
    http_options.port = options_.metrics_port;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
        MetricsHttpServer::Start(http_options, &DefaultMetrics());
    if (!http.ok()) return http.status();
    http_ = *std::move(http);
    node.set_metrics_address(HostPort(advertised, http_->port()));
  }
  PublishStatus();

  CoordinatorClientOptions client_options;
  client_options.coordinator_address = options_.coordinator;
  client_options.node = node;
  CoordinatorCallbacks callbacks;
  callbacks.on_cluster_state = [this](const pb::ClusterState& state) {
    links_->SetTargets(LinkTargets(state, {pb::ROLE_ROUTER}, /*self=*/0));
    absl::MutexLock lock(&mu_);
    state_ = state;
    state_changed_ = true;
  };
  client_ = std::make_unique<CoordinatorClient>(std::move(client_options), std::move(callbacks));
  client_->Start();
  LOG(INFO) << "expert node serving gRPC on " << node.grpc_address()
            << (http_ ? absl::StrCat(", metrics on port ", http_->port()) : "") << ", " << options_.slots
            << " expert slots; registering with the coordinator at " << options_.coordinator;
  return absl::OkStatus();
}

absl::Status ExpertNode::Run(StopSignals* signals) {
  absl::Time next_gauges = absl::InfinitePast();
  for (;;) {
    if (const int signal_number = signals->Poll(); signal_number != 0) {
      LOG(INFO) << name_ << " got signal " << signal_number << "; shutting down";
      return absl::OkStatus();
    }
    if (absl::Status status = MaybeReload(); !status.ok()) return status;
    RunLoadCommands();
    if (!deferred_.empty()) ServeDeferred(/*all=*/false);
    absl::StatusOr<Received> received = transport_->Receive(absl::Now() + kPollInterval);
    if (received.ok()) {
      Serve(*received, /*may_defer=*/true);
    } else if (received.status().code() == absl::StatusCode::kCancelled) {
      return received.status();
    }
    if (absl::Now() >= next_gauges) {
      next_gauges = absl::Now() + kGaugeInterval;
      if (absl::StatusOr<int64_t> rss = ResidentBytes(); rss.ok()) {
        metrics_.resident_bytes->Set(static_cast<double>(*rss));
      }
      pb::LoadStats load;
      load.set_state_bytes(static_cast<int64_t>(metrics_.weight_bytes->Value()));
      client_->SetLoad(load);
    }
  }
}

void ExpertNode::Serve(const Received& received, bool may_defer) {
  if (received.kind == Received::Kind::kPeerFailed) {
    links_->MarkFailed(received.from, received.error);
    return;
  }
  const absl::Time start = absl::Now();
  const int64_t rows_before = worker_->rows_processed();
  ExpertWorker::Outcome outcome = worker_->Handle(transport_.get(), received, may_defer);
  if (outcome.deferred) {
    deferred_.push_back(Deferred{received, start + kDeferLimit});
    return;
  }
  metrics_.seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  metrics_.requests.WithLabels({absl::StatusCodeToString(outcome.answer.code())})->Increment();
  if (const int64_t rows = worker_->rows_processed() - rows_before; rows > 0) {
    metrics_.rows->Increment(static_cast<double>(rows));
    board_.SetRows(worker_->rows_processed());
  }
}

void ExpertNode::ServeDeferred(bool all) {
  const absl::Time now = absl::Now();
  std::deque<Deferred> waiting;
  waiting.swap(deferred_);
  for (Deferred& entry : waiting) {
    if (all || now >= entry.until) {
      Serve(entry.received, /*may_defer=*/now < entry.until);
    } else {
      deferred_.push_back(std::move(entry));
    }
  }
}

absl::Status ExpertNode::MaybeReload() {
  pb::ClusterState state;
  {
    absl::MutexLock lock(&mu_);
    if (!state_changed_) return absl::OkStatus();
    state_changed_ = false;
    state = state_;
  }
  absl::StatusOr<uint32_t> id = client_->WaitRegistered(absl::InfinitePast());
  if (!id.ok()) return absl::OkStatus();  // the state of an earlier registration; wait for the next
  if (*id != node_id_) {
    node_id_ = *id;
    name_ = absl::StrCat("expert node ", node_id_);
    worker_->set_name(name_);
  }
  const int64_t version = state.placement().version();
  if (version <= published_) return absl::OkStatus();
  absl::StatusOr<ClusterPlacement> placement = ClusterPlacementFromProto(state.placement());
  const ModelConfig& config = checkpoint_->config();
  if (placement.ok() && (placement->experts.num_experts != config.num_experts ||
                         placement->experts.num_layers() != config.NumMoeLayers())) {
    placement = absl::InvalidArgumentError(absl::StrCat(
        "it places ", placement->experts.num_experts, " experts in ",
        placement->experts.num_layers(), " MoE layers; the model has ", config.num_experts,
        " in ", config.NumMoeLayers()));
  }
  if (!placement.ok()) {
    LOG(ERROR) << name_ << ": ignoring placement version " << version << ": "
               << placement.status().message();
    return absl::OkStatus();
  }
  // Steps planned with the previous placement may still be in flight: keep its experts.
  retire_floor_ = std::max(retire_floor_, published_);
  published_ = version;
  ExpertHosting hosting = HostingFor(*placement, node_id_);
  const ExpertHosting* held = worker_->FindVersion(version);
  if (held == nullptr || !(*held == hosting)) {
    if (held != nullptr) {
      LOG(WARNING) << name_ << ": placement version " << version << " differs from what "
                   << "LoadExperts gave this node for it; following the cluster state";
    }
    if (absl::Status loaded = Load(std::move(hosting)); !loaded.ok()) return loaded;
  }
  // Versions above the published one were loaded for a rollout that was given up.
  worker_->DropVersions([version](int64_t v) { return v <= version; });
  Retain();
  PublishStatus();
  return absl::OkStatus();
}

absl::Status ExpertNode::Load(ExpertHosting hosting) {
  std::shared_ptr<const ModelWeights> weights;
  const std::vector<int> experts = hosting.Union();
  if (hosting.worker >= 0) weights = worker_->WeightsWith(experts);
  if (hosting.worker >= 0 && weights == nullptr) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<ModelWeights>> loaded =
        LoadWeights(checkpoint_, WeightSelection::Experts(experts));
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("loading the experts of worker ", hosting.worker,
                                       " of placement version ", hosting.placement_version,
                                       ": ", loaded.status().message()));
    }
    weights = *std::move(loaded);
    absl::StatusOr<int64_t> rss = ResidentBytes();
    LOG(INFO) << name_ << " is worker " << hosting.worker << " of placement version "
              << hosting.placement_version << ": " << hosting.TotalExperts() << " experts over "
              << hosting.experts.size() << " MoE layers (" << experts.size() << " of "
              << checkpoint_->config().num_experts << " expert ids), selected weights "
              << weights->selected_bytes << " bytes ("
              << absl::StrFormat("%.1f", weights->selected_bytes / 1048576.0)
              << " MiB), process RSS "
              << (rss.ok() ? absl::StrFormat("%.1f MiB", *rss / 1048576.0) : "unknown")
              << ", loaded in " << absl::FormatDuration(absl::Now() - start);
  } else if (hosting.worker >= 0) {
    LOG(INFO) << name_ << " is worker " << hosting.worker << " of placement version "
              << hosting.placement_version << " with experts it maps already";
  } else {
    LOG(INFO) << name_ << " holds no worker slot in placement version "
              << hosting.placement_version << " (a spare)";
  }
  worker_->AddVersion(std::move(weights), std::move(hosting));
  Retain();
  PublishStatus();
  ServeDeferred(/*all=*/true);  // the requests that waited for this placement
  return absl::OkStatus();
}

void ExpertNode::RunLoadCommands() {
  for (const std::shared_ptr<LoadQueue::Command>& command : loads_.Take()) {
    command->status = LoadExperts(command->request);
    if (!command->status.ok()) {
      LOG(WARNING) << name_ << ": LoadExperts of placement version "
                   << command->request.placement_version() << ": " << command->status;
    }
    command->done.Notify();
  }
}

absl::Status ExpertNode::LoadExperts(const pb::LoadExpertsRequest& request) {
  const ModelConfig& config = checkpoint_->config();
  const int64_t version = request.placement_version();
  if (version < 1 || request.worker() < 0 || request.retire_below_version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoadExperts needs placement_version >= 1 (", version, "), worker >= 0 (",
        request.worker(), ") and retire_below_version >= 0 (", request.retire_below_version(),
        ")"));
  }
  ExpertHosting hosting;
  hosting.placement_version = version;
  hosting.worker = request.worker();
  hosting.experts.resize(config.NumMoeLayers());
  std::vector<bool> listed(config.NumMoeLayers(), false);
  for (const pb::LayerExperts& layer : request.experts()) {
    if (layer.layer() < 0 || layer.layer() >= config.NumMoeLayers() || listed[layer.layer()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MoE layer ", layer.layer(), " is out of range [0, ", config.NumMoeLayers(),
          ") or listed twice"));
    }
    listed[layer.layer()] = true;
    std::vector<int>& ids = hosting.experts[layer.layer()];
    ids.assign(layer.expert_ids().begin(), layer.expert_ids().end());
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end() ||
        (!ids.empty() && (ids.front() < 0 || ids.back() >= config.num_experts))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MoE layer ", layer.layer(), ": expert ids must be distinct and in [0, ",
          config.num_experts, ")"));
    }
  }

  const int64_t newest = worker_->hosting().placement_version;
  if (const ExpertHosting* held = worker_->FindVersion(version); held != nullptr) {
    if (!(*held == hosting)) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, " already holds other experts under placement version ", version));
    }
  } else if (version < newest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "placement version ", version, " is older than version ", newest, " ", name_,
        " holds"));
  } else {
    // Versions loaded for a rollout that was given up (never published) go.
    worker_->DropVersions([this](int64_t v) { return v <= published_; });
    if (absl::Status loaded = Load(std::move(hosting)); !loaded.ok()) return loaded;
  }
  retire_floor_ = std::max(retire_floor_, request.retire_below_version());
  Retain();
  PublishStatus();
  return absl::OkStatus();
}

void ExpertNode::Retain() {
  int64_t in_force = -1;  // the newest held version at or below the published one
  for (int64_t v : worker_->versions()) {
    if (v <= published_) in_force = v;
  }
  const std::vector<int64_t> before = worker_->versions();
  worker_->DropVersions(
      [this, in_force](int64_t v) { return v >= retire_floor_ || v == in_force; });
  if (worker_->versions() != before) {
    LOG(INFO) << name_ << " retired placement versions below " << retire_floor_
              << "; it holds versions " << absl::StrJoin(worker_->versions(), ",");
  }
}

void ExpertNode::PublishStatus() {
  const ExpertHosting& hosting = worker_->hosting();
  const int64_t weight_bytes = worker_->weight_bytes();
  pb::ExpertStatusResponse status;
  status.set_placement_version(hosting.placement_version);
  for (size_t layer = 0; layer < hosting.experts.size(); ++layer) {
    pb::LayerExperts* hosted = status.add_hosted();
    hosted->set_layer(static_cast<int>(layer));
    for (int e : hosting.experts[layer]) hosted->add_expert_ids(e);
  }
  status.set_weight_bytes(weight_bytes);
  status.set_rows_processed(worker_->rows_processed());
  board_.Set(std::move(status));
  metrics_.weight_bytes->Set(static_cast<double>(weight_bytes));
  metrics_.hosted_experts->Set(static_cast<double>(hosting.TotalExperts()));
  server_->SetServing(kServiceName, worker_->weights() != nullptr);
}

void ExpertNode::Shutdown() {
  loads_.Close();
  // Requests still waiting for a placement get their error now rather than a router's timeout.
  std::deque<Deferred> deferred;
  deferred.swap(deferred_);
  for (const Deferred& entry : deferred) Serve(entry.received, /*may_defer=*/false);
  if (worker_ != nullptr) {
    absl::StatusOr<int64_t> rss = ResidentBytes();
    LOG(INFO) << name_ << " computed " << worker_->rows_processed() << " rows; selected weights "
              << static_cast<int64_t>(metrics_.weight_bytes->Value()) << " bytes, process RSS "
              << (rss.ok() ? absl::StrFormat("%.1f MiB", *rss / 1048576.0) : "unknown");
  }
  if (server_) server_->SetServing(kServiceName, false);
  if (client_) client_->Stop();  // Leave: routers stop sending here
  if (links_) links_->Stop();
  if (transport_) transport_->Close();
  if (http_) http_->Stop();
  if (server_) server_->Shutdown(absl::Seconds(1));
}

int Fail(const absl::Status& status) {
  std::cerr << "k3serve expert: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

absl::StatusOr<ExpertNodeOptions> ParseExpertNodeArgs(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags =
      CliFlags::Parse(args, CliFlags::WithNodeFlags({"slots"}));
  if (!flags.ok()) return flags.status();
  ExpertNodeOptions options;
  NodeFlags node;
  node.host = options.host;
  if (absl::Status s = flags->ReadNodeFlags(&node); !s.ok()) return s;
  options.coordinator = node.coordinator;
  options.model = node.model;
  options.host = node.host;
  options.port = node.port;
  options.metrics_port = node.metrics_port;
  if (!flags->Has("slots")) return absl::InvalidArgumentError("--slots is required");
  absl::StatusOr<int64_t> slots = flags->Int("slots", 0);
  if (!slots.ok()) return slots.status();
  if (*slots < 1 || *slots > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--slots is ", *slots, "; must be >= 1"));
  }
  options.slots = static_cast<int>(*slots);
  return options;
}

int RunExpertNode(const std::vector<std::string>& args) {
  absl::StatusOr<ExpertNodeOptions> options = ParseExpertNodeArgs(args);
  if (!options.ok()) return Fail(options.status());
  StopSignals signals;  // before any thread starts
  ExpertNode node(*std::move(options));
  absl::Status status = node.Start();
  if (status.ok()) status = node.Run(&signals);
  node.Shutdown();
  if (!status.ok()) {
    LOG(ERROR) << "expert node: " << status;
    return 1;
  }
  return 0;
}

}  // namespace k3
