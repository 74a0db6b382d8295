#include "expert_nodes/expert_node.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "moe/cluster_placement.h"
#include "cluster/actor.h"
#include "cluster/actor_rpc.h"
#include "cluster/device_channels.h"
#include "cluster/gpu_device_channels.h"
#include "cluster/node_process.h"
#include "cluster/node_runtime.h"
#include "cluster/metrics.h"
#include "cluster/span_log.h"
#include "cluster/node_transport.h"
#include "cluster/ucx_transport.h"
#include "expert_nodes/expert_worker.h"
#include "glog/logging.h"
#include "kernels/thread_pool.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "cluster/peer_links.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr char kServiceName[] = "k3serve.cluster.v1.ExpertWorker";
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);
constexpr absl::Duration kGaugeInterval = absl::Seconds(1);
// How long a request sent under a placement this node has not seen yet waits for it: a router may
// learn of a new placement a heartbeat before the node it names does.
constexpr absl::Duration kDeferLimit = absl::Seconds(2);
// A draining node exits once the published placement has no slot for it and no request came for
// this long: routers switch placements between steps, within a heartbeat of the commit, and the
// steps they planned before finish here on the old experts.
constexpr absl::Duration kDrainQuiet = absl::Seconds(1);

struct NodeMetrics {
  explicit NodeMetrics(MetricsRegistry* r)
      : weight_bytes(r->AddGauge("k3_expert_weight_bytes",
                                 "Bytes of expert weights this node maps or owns").Get()),
        resident_bytes(r->AddGauge("k3_expert_resident_bytes",
                                   "Resident set size of the process").Get()),
        hosted_experts(r->AddGauge("k3_expert_hosted_experts",
                                   "Experts hosted, summed over MoE layers").Get()),
        device_weight_bytes(r->AddGauge("k3_expert_device_weight_bytes",
                                        "Bytes of expert weights copied to the GPU (--device)")
                                .Get()),
        rows(r->AddCounter("k3_expert_rows_total", "Rows computed").Get()),
        requests(r->AddCounter("k3_expert_requests_total", "ExpertRequests answered, by code",
                               {"code"})),
        seconds(r->AddHistogram("k3_expert_request_seconds", "Time to compute one ExpertRequest",
                                ExponentialBuckets(1e-5, 2, 20))
                    .Get()) {}

  Gauge* weight_bytes;
  Gauge* resident_bytes;
  Gauge* hosted_experts;
  Gauge* device_weight_bytes;
  Counter* rows;
  MetricFamily<Counter>& requests;
  Histogram* seconds;
};

class ExpertNode final : public RoleHooks {
 public:
  explicit ExpertNode(ExpertNodeOptions options)
      : options_(std::move(options)), metrics_(&DefaultMetrics()) {}

  absl::Status Start() override;
  // An error once a placement's experts could not be loaded or the transport is gone.
  absl::Status Failure() override {
    absl::MutexLock lock(&failure_mu_);
    return failure_;
  }
  bool Finished() override { return drained_; }
  // Refuses a stop while the coordinator refuses this node's drain (its experts would be lost).
  absl::Status AcceptStop() override;
  void Shutdown() override;

  // The ExpertWorker RPCs, run on the actor.
  absl::Status LoadExperts(const pb::LoadExpertsRequest& request);
  const pb::ExpertStatusResponse& status() const { return status_; }
  Actor* actor() const { return actor_.get(); }

 private:
  // One turn of the data plane on the actor; posts itself again so that the mailbox's other
  // messages (cluster states, RPCs) run between turns.
  void Pump();
  void Fail(absl::Status status);
  // Acts on a new cluster state: loads the experts of a new placement when they changed.
  absl::Status OnClusterState(const pb::ClusterState& state);
  // Serves `hosting` from now on, with the experts of older versions still held (see Retain).
  absl::Status Load(ExpertHosting hosting);
  // Drops the versions no router may still use: those below retire_floor_, except the newest at
  // or below the published placement (the one in force as far as this node knows).
  void Retain();
  void PublishStatus();
  // Answers a request (see ExpertWorker::Handle for `may_defer`) and records it in the metrics.
  void Serve(Received received, bool may_defer);
  // Hands deferred requests to the current worker: all of them, or those past their limit.
  void ServeDeferred(bool all);
  // Starts draining (the coordinator's drain flag, or SIGTERM through DrainFirst).
  void StartDraining(const std::string& why);
  // Sets drained_ once a draining node may go (see kDrainQuiet).
  void CheckDrained();
  // SIGTERM on a worker: asks the coordinator to move its experts and serves until they moved
  // (drained_), up to options_.drain_timeout; returns at once when nothing needs it.
  void DrainFirst();

  const ExpertNodeOptions options_;
  NodeMetrics metrics_;
  std::shared_ptr<const Checkpoint> checkpoint_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<PeerLinks> links_;
  // On a GPU: the device channels to GPU attention workers (their rows come on them); null on
  // the CPU. Declared before worker_, which uses it.
  std::unique_ptr<DeviceChannels> device_channels_;
  std::unique_ptr<Actor> actor_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<NodeEndpoints> endpoints_;

  absl::Mutex failure_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
  std::atomic<bool> drained_{false};  // set on the actor; RunNode then shuts the node down
  absl::Notification drained_notice_;  // notified with drained_

  // Actor thread only.
  pb::ExpertStatusResponse status_;  // the Status RPC's answer
  absl::Time next_gauges_ = absl::InfinitePast();
  uint32_t node_id_ = 0;
  std::string name_ = "expert node (unregistered)";
  std::unique_ptr<SpanLog> spans_;  // with --trace-file; outlives worker_
  std::unique_ptr<ExpertWorker> worker_;  // holds every placement version still in use
  int64_t published_ = 0;      // the newest placement version of the cluster state
  int64_t retire_floor_ = 0;   // versions below this one may go (see Retain)
  bool draining_ = false;
  // Since when the published placement has had no worker slot for this node (InfiniteFuture
  // while it has one), and when the last request came.
  absl::Time unplaced_since_ = absl::Now();
  absl::Time last_request_ = absl::InfinitePast();
  struct Deferred {
    Received received;
    absl::Time until;  // answered by whatever worker is current then
  };
  std::deque<Deferred> deferred_;
};

// The ExpertWorker RPCs, carried out on the node's actor (RunOnActor: no gRPC thread waits).
class ExpertWorkerService final : public pb::ExpertWorker::CallbackService {
 public:
  explicit ExpertWorkerService(ExpertNode* node) : node_(node) {}

  grpc::ServerUnaryReactor* LoadExperts(grpc::CallbackServerContext* context,
                                        const pb::LoadExpertsRequest* request,
                                        pb::LoadExpertsResponse* response) override {
    ExpertNode* node = node_;
    return RunOnActor(*node_->actor(), context, [node, request, response] {
      const absl::Status status = node->LoadExperts(*request);
      if (status.ok()) response->set_placement_version(request->placement_version());
      return status;
    });
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const pb::ExpertStatusRequest*,
                                   pb::ExpertStatusResponse* response) override {
    ExpertNode* node = node_;
    return RunOnActor(*node_->actor(), context, [node, response] {
      *response = node->status();
      return absl::OkStatus();
    });
  }

 private:
  ExpertNode* const node_;
};

absl::Status ExpertNode::Start() {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint,
                      Checkpoint::Open(options_.node.model));
  checkpoint_ = std::move(checkpoint);
  const ModelConfig& config = checkpoint_->config();
  if (config.num_experts == 0 || config.NumMoeLayers() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model in ", options_.node.model, " has no routed experts"));
  }
  worker_ = std::make_unique<ExpertWorker>(nullptr, ExpertHosting(), name_);
  K3_ASSIGN_OR_RETURN(std::unique_ptr<DeviceExperts> device, MakeDeviceExperts(options_.device));
  if (device != nullptr) {
    LOG(INFO) << name_ << " computes its experts on " << ComputeDeviceName(options_.device);
    K3_RETURN_IF_ERROR(worker_->UseDevice(std::move(device)));
  }
  if (!options_.node.trace_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<SpanLog> spans,
                        SpanLog::Open(options_.node.trace_file, "expert"));
    spans_ = std::move(spans);
    worker_->set_span_log(spans_.get());
  }

  K3_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> transport, CreateNodeTransport(options_.node));
  transport_ = std::move(transport);
  links_ = std::make_unique<PeerLinks>(transport_.get());
  actor_ = std::make_unique<Actor>("expert");
  service_ = std::make_unique<ExpertWorkerService>(this);

  NodeEndpointsOptions endpoint_options;
  endpoint_options.flags = options_.node;
  endpoint_options.role = pb::ROLE_EXPERT;
  endpoint_options.readiness_service = kServiceName;
  endpoint_options.services = {service_.get()};
  K3_ASSIGN_OR_RETURN(std::unique_ptr<NodeEndpoints> endpoints,
                      NodeEndpoints::Start(std::move(endpoint_options)));
  endpoints_ = std::move(endpoints);
  if (absl::Status s = actor_->Call([this] { PublishStatus(); }, absl::InfiniteFuture()); !s.ok()) {
    return s;
  }

  pb::NodeInfo node;
  node.set_transport_address(transport_->LocalAddress());
  node.set_expert_slots(options_.slots);
  if (options_.device.cuda >= 0) {
    // GPU attention workers on other GPUs send rows GPU to GPU (issue 21; docs/GPU.md).
    K3_ASSIGN_OR_RETURN(GpuChannelSetup setup, NcclChannelSetup(options_.device.cuda));
    node.set_gpu_uuid(setup.gpu_uuid);
    device_channels_ = std::make_unique<DeviceChannels>(std::move(setup.opener));
    worker_->set_device_channels(device_channels_.get());
  }
  CoordinatorCallbacks callbacks;
  callbacks.on_cluster_state = [this](const pb::ClusterState& state) {
    actor_->Post([this, state] {
      // GPU attention workers send their device path's requests here directly.
      const std::set<pb::Role> peers =
          device_channels_ != nullptr ? std::set<pb::Role>{pb::ROLE_ROUTER, pb::ROLE_ATTENTION}
                                      : std::set<pb::Role>{pb::ROLE_ROUTER};
      links_->SetTargets(LinkTargets(state, peers, /*self=*/0));
      if (absl::Status s = OnClusterState(state); !s.ok()) Fail(s);
    });
  };
  callbacks.on_drain = [this] {
    actor_->Post([this] { StartDraining("the coordinator asked this node to drain"); });
  };
  LOG(INFO) << "expert node with " << options_.slots << " expert slots";
  std::function<std::vector<uint64_t>()> take_broken;
  if (DeviceChannels* channels = device_channels_.get()) {
    take_broken = [channels] { return channels->TakeBroken(); };
  }
  endpoints_->Register(std::move(node), std::move(callbacks), std::move(take_broken));
  actor_->Post([this] { Pump(); });
  return absl::OkStatus();
}

void ExpertNode::Fail(absl::Status status) {
  absl::MutexLock lock(&failure_mu_);
  if (failure_.ok()) failure_ = std::move(status);
}

void ExpertNode::Pump() {
  if (!deferred_.empty()) ServeDeferred(/*all=*/false);
  if (draining_) CheckDrained();
  RestKernelThreads();  // nothing to compute until a message arrives
  absl::StatusOr<Received> received = transport_->Receive(absl::Now() + kPollInterval);
  if (received.ok()) {
    Serve(std::move(*received), /*may_defer=*/true);
  } else if (received.status().code() == absl::StatusCode::kCancelled) {
    Fail(received.status());
    return;  // the transport is gone: no more turns
  }
  if (absl::Now() >= next_gauges_) {
    next_gauges_ = absl::Now() + kGaugeInterval;
    if (absl::StatusOr<int64_t> rss = ResidentBytes(); rss.ok()) {
      metrics_.resident_bytes->Set(static_cast<double>(*rss));
    }
    pb::LoadStats load;
    load.set_state_bytes(static_cast<int64_t>(metrics_.weight_bytes->Value()));
    endpoints_->client()->SetLoad(load);
  }
  actor_->Post([this] { Pump(); });
}

void ExpertNode::Serve(Received received, bool may_defer) {
  if (received.kind == Received::Kind::kPeerFailed) {
    links_->MarkFailed(received.from, received.error);
    return;
  }
  const absl::Time start = absl::Now();
  last_request_ = start;
  const int64_t rows_before = worker_->rows_processed();
  ExpertWorker::Outcome outcome = worker_->Handle(transport_.get(), received, may_defer);
  if (outcome.deferred) {
    deferred_.push_back(Deferred{std::move(received), start + kDeferLimit});
    return;
  }
  metrics_.seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  metrics_.requests.WithLabels({absl::StatusCodeToString(outcome.answer.code())})->Increment();
  if (const int64_t rows = worker_->rows_processed() - rows_before; rows > 0) {
    metrics_.rows->Increment(static_cast<double>(rows));
    status_.set_rows_processed(worker_->rows_processed());
    status_.mutable_assignments_per_layer()->Assign(worker_->assignments_per_layer().begin(),
                                                    worker_->assignments_per_layer().end());
  }
}

void ExpertNode::ServeDeferred(bool all) {
  const absl::Time now = absl::Now();
  std::deque<Deferred> waiting;
  waiting.swap(deferred_);
  for (Deferred& entry : waiting) {
    if (all || now >= entry.until) {
      Serve(std::move(entry.received), /*may_defer=*/now < entry.until);
    } else {
      deferred_.push_back(std::move(entry));
    }
  }
}

absl::Status ExpertNode::OnClusterState(const pb::ClusterState& state) {
  absl::StatusOr<uint32_t> id = endpoints_->client()->WaitRegistered(absl::InfinitePast());
  if (!id.ok()) return absl::OkStatus();  // the state of an earlier registration; wait for the next
  if (device_channels_ != nullptr) device_channels_->Apply(state, *id);
  if (*id != node_id_) {
    node_id_ = *id;
    name_ = absl::StrCat("expert node ", node_id_);
    worker_->set_name(name_);
  }
  const int64_t version = state.placement().version();
  if (version <= published_) return absl::OkStatus();
  const ModelConfig& config = checkpoint_->config();
  const absl::StatusOr<ClusterPlacement> placement =
      ClusterPlacementForModel(state.placement(), config.num_experts, config.NumMoeLayers());
  if (!placement.ok()) {
    LOG(ERROR) << name_ << ": ignoring placement version " << version << ": "
               << placement.status().message();
    return absl::OkStatus();
  }
  // Steps planned with the previous placement may still be in flight: keep its experts.
  retire_floor_ = std::max(retire_floor_, published_);
  published_ = version;
  ExpertHosting hosting = HostingFor(*placement, node_id_);
  if (hosting.worker >= 0) {
    unplaced_since_ = absl::InfiniteFuture();
  } else if (unplaced_since_ == absl::InfiniteFuture()) {
    unplaced_since_ = absl::Now();
    LOG(INFO) << name_ << " has no worker slot in placement version " << version
              << (draining_ ? "; it exits once the routers stopped sending it steps" : "");
  }
  const ExpertHosting* held = worker_->FindVersion(version);
  if (held == nullptr || !(*held == hosting)) {
    if (held != nullptr) {
      LOG(WARNING) << name_ << ": placement version " << version << " differs from what "
                   << "LoadExperts gave this node for it; following the cluster state";
    }
    K3_RETURN_IF_ERROR(Load(std::move(hosting)));
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
  const int64_t version = hosting.placement_version;
  worker_->AddVersion(std::move(weights), std::move(hosting));
  if (absl::Status on_device = worker_->DeviceStatus(version); !on_device.ok()) {
    worker_->DropVersions([version](int64_t v) { return v != version; });
    return absl::Status(on_device.code(),
                        absl::StrCat("copying the experts of placement version ", version, " to ",
                                     ComputeDeviceName(options_.device), ": ",
                                     on_device.message()));
  }
  Retain();
  PublishStatus();
  ServeDeferred(/*all=*/true);  // the requests that waited for this placement
  return absl::OkStatus();
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
    // Versions loaded for a rollout that was given up (never published) go. The version the
    // coordinator had in force stays although this node's cluster state may not name it yet:
    // a rollout can start right after the last one committed, and routers use that version.
    const int64_t committed = std::max(published_, request.committed_version());
    worker_->DropVersions([committed](int64_t v) { return v <= committed; });
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

void ExpertNode::StartDraining(const std::string& why) {
  if (draining_) return;
  draining_ = true;
  LOG(INFO) << name_ << " drains (" << why << "): it serves until a placement without it is in "
            << "force, then exits";
}

void ExpertNode::CheckDrained() {
  if (drained_ || unplaced_since_ == absl::InfiniteFuture()) return;
  const absl::Time now = absl::Now();
  if (now - std::max(unplaced_since_, last_request_) < kDrainQuiet) return;
  LOG(INFO) << name_ << " drained: no worker slot since "
            << absl::FormatDuration(now - unplaced_since_) << " ago and no request for "
            << absl::FormatDuration(kDrainQuiet);
  drained_ = true;
  drained_notice_.Notify();  // wakes DrainFirst at once
}

// Why nobody would take this node's experts, or "" when the drain can go on: no live router
// needs them (the launcher stops routers before expert nodes), or no other expert node could
// hold them (e.g. every expert node got SIGTERM at once).
std::string NobodyNeedsTheDrain(const pb::ClusterState& state, uint32_t self) {
  bool router = false;
  bool other_expert = false;
  for (const pb::Member& m : state.members()) {
    if (m.state() != pb::ALIVE) continue;
    router |= m.node().role() == pb::ROLE_ROUTER;
    other_expert |= m.node().role() == pb::ROLE_EXPERT && !m.draining() &&
                    m.node().node_id() != self;
  }
  if (!router) return "no live router needs its experts";
  if (!other_expert) return "no other expert node can take its experts";
  return "";
}

absl::Status ExpertNode::AcceptStop() {
  if (endpoints_ == nullptr || endpoints_->client() == nullptr || !Failure().ok()) {
    return absl::OkStatus();
  }
  absl::StatusOr<bool> placed =
      actor_->Call([this] { return unplaced_since_ == absl::InfiniteFuture(); },
                   absl::Now() + absl::Seconds(2));
  if (!placed.ok() || !*placed) return absl::OkStatus();
  // Asking to drain now (DrainFirst asks again, harmlessly) learns whether it may go at all.
  // Unregistered (e.g. the coordinator is gone), nobody can take its experts: it may go.
  if (!endpoints_->client()->WaitRegistered(absl::InfinitePast()).ok()) return absl::OkStatus();
  absl::StatusOr<pb::ClusterState> state = endpoints_->client()->DrainSelf();
  if (absl::IsFailedPrecondition(state.status())) return state.status();
  return absl::OkStatus();
}

void ExpertNode::DrainFirst() {
  absl::StatusOr<bool> placed =
      actor_->Call([this] { return unplaced_since_ == absl::InfiniteFuture(); },
                   absl::Now() + absl::Seconds(2));
  if (!placed.ok() || !*placed) return;  // no experts of its own to move
  CoordinatorClient* client = endpoints_->client();
  absl::StatusOr<uint32_t> self = client->WaitRegistered(absl::InfinitePast());
  absl::StatusOr<pb::ClusterState> state = client->DrainSelf();
  if (!self.ok() || !state.ok()) {
    LOG(WARNING) << "expert node: cannot ask the coordinator to move its experts ("
                 << (self.ok() ? state.status() : self.status()) << "); leaving with them";
    return;
  }
  std::string nobody = NobodyNeedsTheDrain(*state, *self);
  if (!nobody.empty()) {
    LOG(INFO) << "expert node " << *self << " leaves without draining: " << nobody;
    return;
  }
  actor_->Post([this] { StartDraining("SIGTERM"); });
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  absl::Time next_look = absl::Now();
  while (!drained_ && absl::Now() < deadline && Failure().ok()) {
    if (absl::Now() >= next_look) {
      // The last state the coordinator client fetched (it follows every membership change).
      const pb::ClusterState seen = client->cluster_state();
      nobody = NobodyNeedsTheDrain(seen, *self);
      if (!nobody.empty()) {
        LOG(INFO) << "expert node " << *self << " stops draining: " << nobody;
        return;
      }
      // A restarted coordinator relearns this node without its drain flag: ask again.
      for (const pb::Member& m : seen.members()) {
        if (m.node().node_id() == *self && m.state() == pb::ALIVE && !m.draining()) {
          client->DrainSelf().IgnoreError();
        }
      }
      next_look = absl::Now() + absl::Milliseconds(250);
    }
    // Woken at once when the actor finds the node drained; else looks again at next_look.
    drained_notice_.WaitForNotificationWithTimeout(
        std::min(next_look, deadline) - absl::Now());
  }
  if (!drained_) {
    LOG(WARNING) << "expert node: its experts did not move within "
                 << absl::FormatDuration(options_.drain_timeout) << "; leaving with them";
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
  status.mutable_assignments_per_layer()->Assign(worker_->assignments_per_layer().begin(),
                                                 worker_->assignments_per_layer().end());
  status_ = std::move(status);
  metrics_.weight_bytes->Set(static_cast<double>(weight_bytes));
  metrics_.hosted_experts->Set(static_cast<double>(hosting.TotalExperts()));
  metrics_.device_weight_bytes->Set(static_cast<double>(worker_->device_weight_bytes()));
  endpoints_->SetReady(worker_->weights() != nullptr);
}

void ExpertNode::Shutdown() {
  if (actor_ && endpoints_ && endpoints_->client() != nullptr && !drained_ && Failure().ok()) {
    DrainFirst();
  }
  if (endpoints_) endpoints_->SetReady(false);
  if (actor_) {
    actor_->Call(
        [this] {
          // Requests still waiting for a placement get their error now rather than a router's
          // timeout.
          std::deque<Deferred> deferred;
          deferred.swap(deferred_);
          for (Deferred& entry : deferred) Serve(std::move(entry.received), /*may_defer=*/false);
          absl::StatusOr<int64_t> rss = ResidentBytes();
          LOG(INFO) << name_ << " computed " << worker_->rows_processed()
                    << " rows; selected weights "
                    << static_cast<int64_t>(metrics_.weight_bytes->Value())
                    << " bytes, process RSS "
                    << (rss.ok() ? absl::StrFormat("%.1f MiB", *rss / 1048576.0) : "unknown");
        },
        absl::Now() + absl::Seconds(2))
        .IgnoreError();
    actor_->Stop();  // later LoadExperts / Status calls get UNAVAILABLE
  }
  StopDataPlane(endpoints_.get(), links_.get(), transport_.get());
}

}  // namespace

void AddExpertNodeFlags(CLI::App* app, ExpertNodeOptions* options) {
  AddNodeFlags(app, &options->node);
  AddBoundedInt(app, "--slots", &options->slots, 1, 1 << 20,
                "experts per MoE layer this node can host")
      ->required();
  AddMilliseconds(app, "--drain-timeout-ms", &options->drain_timeout, 0, 24 * 3600 * 1000,
                  "on SIGTERM, how long to wait for the coordinator to move this node's experts");
  AddDeviceFlag(app, &options->device,
                "where to compute the experts: cpu (default), cuda or cuda:N (MXFP4 experts on "
                "that GPU; docs/GPU.md)");
}

Subcommand AddExpertNodeCommand(CLI::App* top) {
  return AddNodeSubcommand<ExpertNode>(
      top, "expert", "an expert worker: a slice of the routed experts", AddExpertNodeFlags);
}

}  // namespace k3
