#include "router/router_core.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "kernels/thread_pool.h"
#include "moe/moe_layer_map.h"
#include "moe/moe_wire.h"
#include "router/router_step.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

// How often held steps (router_core.h) are planned again without a new cluster state: a link that
// comes up changes no state.
constexpr absl::Duration kHeldRetry = absl::Milliseconds(100);

}  // namespace

struct RouterCore::Metrics {
  explicit Metrics(MetricsRegistry* registry)
      : steps(registry->AddCounter("k3_router_steps_total",
                                   "MoE layer steps answered, by status code", {"code"})),
        step_seconds(registry
                         ->AddHistogram("k3_router_step_seconds",
                                        "Time from a MoeRequest's arrival to its MoeResponse",
                                        ExponentialBuckets(1e-4, 2, 18))
                         .Get()),
        step_compute(registry
                         ->AddHistogram("k3_router_step_compute_seconds",
                                        "Router compute of one answered MoE layer step: gate, "
                                        "top-k, dispatch plan and encoding, then the combine",
                                        ExponentialBuckets(1e-5, 2, 20))
                         .Get()),
        step_expert_wait(registry
                             ->AddHistogram("k3_router_step_expert_wait_seconds",
                                            "From a MoE layer step's last ExpertRequest sent to "
                                            "its last answer: the wire both ways plus the expert "
                                            "workers' k3_expert_request_seconds",
                                            ExponentialBuckets(1e-5, 2, 20))
                             .Get()),
        pending(registry->AddGauge("k3_router_pending_steps", "MoE layer steps in flight").Get()),
        tokens(registry->AddCounter("k3_router_routed_tokens_total",
                                    "Tokens routed, by MoE layer index", {"layer"})),
        max_vio(registry->AddGauge(
            "k3_router_expert_load_max_vio",
            "(max - mean) / mean tokens per expert over the load-statistics window, by MoE layer",
            {"layer"})) {}

  // Routed (token, expert) pairs per expert id, summed over layers; empty unless enabled.
  void EnablePerExpert(MetricsRegistry* registry, int num_experts) {
    MetricFamily<Counter>& family = registry->AddCounter(
        "k3_router_expert_routed_tokens_total",
        "Tokens routed to each expert id, summed over MoE layers (opt-in: --per-expert-metrics)",
        {"expert"});
    for (int e = 0; e < num_experts; ++e) {
      expert_tokens.push_back(family.WithLabels({absl::StrCat(e)}));
    }
  }

  MetricFamily<Counter>& steps;
  Histogram* step_seconds;
  Histogram* step_compute;
  Histogram* step_expert_wait;
  Gauge* pending;
  MetricFamily<Counter>& tokens;
  MetricFamily<Gauge>& max_vio;
  std::vector<Counter*> expert_tokens;
};

absl::StatusOr<std::unique_ptr<RouterCore>> RouterCore::Create(const ModelWeights* weights,
                                                               Transport* transport,
                                                               PeerLinks* links,
                                                               const RouterCoreOptions& options,
                                                               MetricsRegistry* metrics) {
  const ModelConfig& config = weights->config;
  if (config.num_experts == 0 || config.NumMoeLayers() == 0) {
    return absl::InvalidArgumentError("the model has no routed experts: it needs no router");
  }
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step timeout must be positive, not ", absl::FormatDuration(options.step_timeout)));
  }
  if (options.expert_retry_floor <= absl::ZeroDuration() ||
      !(options.expert_retry_p99_factor >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the expert deadline needs a positive floor and a p99 factor of at least 1, not ",
        absl::FormatDuration(options.expert_retry_floor), " and ",
        options.expert_retry_p99_factor));
  }
  std::vector<std::vector<float>> bias;
  for (int moe = 0; moe < config.NumMoeLayers(); ++moe) {
    const int layer = *ModelLayerOfMoe(config, moe);
    const RouterWeights& router = weights->layers[layer].moe.router;
    if (router.gate.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the router weights of layer ", layer, " are not loaded"));
    }
    bias.push_back(router.score_bias);
  }
  absl::StatusOr<std::unique_ptr<RouterLoadStats>> stats = RouterLoadStats::Create(
      config.num_experts, config.num_experts_per_token, bias, options.qb_bins);
  if (!stats.ok()) return stats.status();
  return std::unique_ptr<RouterCore>(
      new RouterCore(weights, transport, links, options, *std::move(stats), metrics));
}

RouterCore::RouterCore(const ModelWeights* weights, Transport* transport, PeerLinks* links,
                       const RouterCoreOptions& options, std::unique_ptr<RouterLoadStats> stats,
                       MetricsRegistry* metrics)
    : weights_(weights),
      config_(weights->config),
      transport_(transport),
      links_(links),
      options_(options),
      stats_(std::move(stats)),
      metrics_(metrics != nullptr ? std::make_unique<Metrics>(metrics) : nullptr),
      placement_problem_("no cluster state from the coordinator yet"),
      expert_deadline_(options.expert_retry_floor, options.expert_retry_p99_factor) {
  if (metrics_ != nullptr && options.per_expert_metrics) {
    metrics_->EnablePerExpert(metrics, config_.num_experts);
  }
  routers_.resize(weights_->layers.size());
  for (size_t layer = 0; layer < weights_->layers.size(); ++layer) {
    if (weights_->layers[layer].is_moe) routers_[layer] = weights_->layers[layer].moe.router;
  }
}

RouterCore::~RouterCore() = default;

void RouterCore::UpdateClusterState(const pb::ClusterState& state) {
  ApplyClusterState(state);
  RetryHeld();
  UpdateReadiness();
}

absl::Status RouterCore::Poll(absl::Time deadline) {
  if (!held_.empty() && absl::Now() >= next_held_retry_) RetryHeld();
  absl::Time wake = std::min(deadline, pending_.NextDeadline());
  if (!held_.empty()) wake = std::min(wake, next_held_retry_);
  RestKernelThreads();  // nothing to compute until a message arrives
  absl::StatusOr<Received> received = transport_->Receive(wake);
  if (received.ok()) {
    if (received->kind == Received::Kind::kPeerFailed) {
      links_->MarkFailed(received->from, received->error);
      FailWaitingOn(received->from, NodeStatus(received->from));
    } else {
      absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received->bytes);
      if (kind.ok() && *kind == MoeMessageKind::kMoeRequest) {
        HandleMoeRequest(received->from, std::move(received->bytes), absl::Now());
      } else if (kind.ok() && *kind == MoeMessageKind::kExpertResponse) {
        HandleExpertResponse(received->from, std::move(received->bytes));
      } else {
        LOG_EVERY_N(WARNING, 100) << "dropping a message from peer " << received->from
                                  << " that a router does not take"
                                  << (kind.ok() ? "" : absl::StrCat(": ", kind.status().message()));
      }
    }
  } else if (received.status().code() == absl::StatusCode::kCancelled) {
    return received.status();
  }
  ExpireSteps(absl::Now());
  ExpireHeld(absl::Now());
  UpdateReadiness();
  if (metrics_ != nullptr) metrics_->pending->Set(static_cast<double>(pending_.size()));
  return absl::OkStatus();
}

absl::Status RouterCore::SetBias(int moe_layer, std::vector<float> bias) {
  absl::StatusOr<int> layer = ModelLayerOfMoe(config_, moe_layer);
  if (!layer.ok()) return layer.status();
  if (static_cast<int>(bias.size()) != config_.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("a bias of ", bias.size(), " values for ",
                                                   config_.num_experts, " experts"));
  }
  for (float b : bias) {
    if (!std::isfinite(b)) return absl::InvalidArgumentError("the bias is not finite");
  }
  LOG(INFO) << "MoE layer " << moe_layer << " routes with a new e_score_correction_bias "
            << "(online bias: the model's outputs change)";
  routers_[*layer].score_bias = bias;
  stats_->SetBias(moe_layer, std::move(bias));
  return absl::OkStatus();
}

void RouterCore::ApplyClusterState(const pb::ClusterState& state) {
  lost_experts_reason_ = state.lost_experts_reason();
  // Until the coordinator notices a node's death, its entry here says whether to wait; after,
  // lost_experts_reason does.
  unrecoverable_losses_.clear();
  unrecoverable_losses_.insert(state.unrecoverable_losses().begin(),
                               state.unrecoverable_losses().end());
  members_.clear();
  for (const pb::Member& member : state.members()) members_[member.node().node_id()] = member;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    auto member = members_.find(it->first);
    const bool same_process =
        member != members_.end() && member->second.node().incarnation() == it->second.incarnation;
    it = same_process ? std::next(it) : suspects_.erase(it);
  }

  const pb::ExpertPlacement& proto = state.placement();
  if (proto.version() == 0) {
    if (!placement_.placed()) {
      placement_problem_ = absl::StrCat("no expert placement yet (coordinator: ",
                                        state.not_ready_reason(), ")");
    }
  } else if (proto.version() > placement_.version() || !placement_problem_.empty()) {
    absl::StatusOr<ClusterPlacement> placement = ClusterPlacementFromProto(proto);
    if (placement.ok() && (placement->experts.num_experts != config_.num_experts ||
                           placement->experts.num_layers() != config_.NumMoeLayers())) {
      placement = absl::InvalidArgumentError(absl::StrCat(
          "it places ", placement->experts.num_experts, " experts in ",
          placement->experts.num_layers(), " MoE layers; the model has ", config_.num_experts,
          " in ", config_.NumMoeLayers()));
    }
    if (placement.ok()) {
      if (placement->version() != placement_.version()) {
        LOG(INFO) << "placement version " << placement->version() << ": workers on nodes "
                  << absl::StrJoin(placement->worker_nodes, ",");
      }
      placement_ = *std::move(placement);
      placement_problem_.clear();
      has_replicas_ = false;
      for (const auto& layer : placement_.experts.hosts) {
        for (const std::vector<int>& hosts : layer) has_replicas_ |= hosts.size() > 1;
      }
    } else {
      // Acting on an older placement would send rows to the wrong workers.
      placement_ = ClusterPlacement();
      placement_problem_ = absl::StrCat("cannot use placement version ", proto.version(), ": ",
                                        placement.status().message());
      LOG(ERROR) << placement_problem_;
    }
  }
  // Steps waiting for nodes that died or left end now.
  for (PeerId node : pending_.AwaitedNodes()) {
    absl::Status status = NodeStatus(node);
    if (!status.ok()) FailWaitingOn(node, status);
  }
  // A slow node the coordinator declared DEAD (or that left) may never answer what it owed (its
  // links are dropped): once it is ALIVE again it starts afresh.
  for (auto it = slow_.begin(); it != slow_.end();) {
    auto member = members_.find(static_cast<uint32_t>(*it));
    if (member == members_.end() || member->second.state() != pb::ALIVE) {
      it = slow_.erase(it);
    } else {
      ++it;
    }
  }
}

void RouterCore::HoldOrFail(PeerId origin, uint64_t origin_step, absl::Time start,
                            MessageBytes request, PeerId node, const absl::Status& why) {
  // The coordinator's verdict on this node's death, which it may not have noticed yet (the
  // transport reports a dead process at once), or on the experts it already knows are lost.
  const auto unrecoverable = unrecoverable_losses_.find(static_cast<uint32_t>(node));
  const std::string& cause = unrecoverable != unrecoverable_losses_.end() ? unrecoverable->second
                                                                          : lost_experts_reason_;
  if (!cause.empty()) {
    FailHeld(origin, origin_step, start, request,
             absl::UnavailableError(absl::StrCat(
                 why.message(), "; the coordinator cannot move its experts: ", cause)));
    return;
  }
  if (absl::Now() - start >= options_.step_timeout) {
    FailHeld(origin, origin_step, start, request,
             absl::UnavailableError(absl::StrCat(why.message(), "; no live node took its experts "
                                                 "within ",
                                                 absl::FormatDuration(options_.step_timeout))));
    return;
  }
  if (held_.empty()) next_held_retry_ = absl::Now() + kHeldRetry;
  if (why.message() != holding_for_) {  // RetryHeld holds the same steps again every kHeldRetry
    holding_for_ = std::string(why.message());
    LOG(WARNING) << "holding steps whose rows need experts without a live host (" << holding_for_
                 << ") until the coordinator moves them";
  }
  held_.push_back(Held{origin, origin_step, start, std::move(request), node, why});
}

void RouterCore::RetryHeld() {
  next_held_retry_ = absl::Now() + kHeldRetry;
  std::vector<Held> held;
  held.swap(held_);
  for (Held& h : held) HandleMoeRequest(h.origin, std::move(h.request), h.start, /*held=*/true);
  if (!held.empty() && held_.empty()) {
    LOG(INFO) << held.size() << " held step(s) planned again under placement version "
              << placement_.version();
  }
  if (held_.empty()) holding_for_.clear();
}

void RouterCore::ExpireHeld(absl::Time now) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->start < options_.step_timeout) {
      ++it;
      continue;
    }
    HoldOrFail(it->origin, it->origin_step, it->start, std::move(it->request), it->node,
               it->why);
    it = held_.erase(it);
  }
  if (held_.empty()) holding_for_.clear();
}

std::string RouterCore::WorkerName(PeerId node) const {
  auto it = members_.find(static_cast<uint32_t>(node));
  if (it == members_.end()) return absl::StrCat("expert worker node ", node);
  const pb::NodeInfo& info = it->second.node();
  return absl::StrCat("expert worker node ", node, " (pid ", info.pid(), " on ",
                      info.host().empty() ? "?" : info.host(), ")");
}

absl::Status RouterCore::NodeStatus(PeerId node) const {
  auto member = members_.find(static_cast<uint32_t>(node));
  if (member == members_.end()) {
    return absl::UnavailableError(
        absl::StrCat(WorkerName(node), " lost: it is not a member of the cluster"));
  }
  if (member->second.state() == pb::LEFT) {
    return absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: it left the cluster"));
  }
  if (member->second.state() == pb::DEAD) {
    return absl::UnavailableError(absl::StrCat(
        WorkerName(node), " lost: the coordinator marked it DEAD (its heartbeats stopped)"));
  }
  if (auto suspect = suspects_.find(node); suspect != suspects_.end()) {
    return absl::UnavailableError(
        absl::StrCat(WorkerName(node), " lost: ", suspect->second.reason));
  }
  absl::Status link = links_->LinkStatus(node);
  if (link.ok()) return link;
  if (link.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: ", link.message()));
  }
  // This router's own problem (a new router whose links are still coming up): ABORTED tells the
  // attention worker to send the layer to another router (attention_nodes/remote_routed_moe.h).
  return absl::AbortedError(absl::StrCat(WorkerName(node),
                                         " is not connected to this router: ", link.message()));
}

bool RouterCore::OnlySuspected(PeerId node) const {
  if (suspects_.count(node) == 0) return false;
  auto member = members_.find(static_cast<uint32_t>(node));
  return member != members_.end() && member->second.state() != pb::LEFT &&
         member->second.state() != pb::DEAD && links_->LinkStatus(node).ok();
}

absl::Status RouterCore::WorkerStatus(int worker) const {
  return NodeStatus(placement_.worker_nodes[worker]);
}

void RouterCore::HandleMoeRequest(PeerId from, MessageBytes bytes, absl::Time start,
                                  bool held) {
  MoeRequest request;
  absl::Span<const float> rows;  // read in place, inside `bytes`
  if (absl::Status decoded = DecodeInPlace(bytes, &request, &rows); !decoded.ok()) {
    // Decode reads the step id first: the attention worker can match the answer if it got there.
    Reply(from, request.step_id, start, decoded);
    return;
  }
  absl::StatusOr<int> moe_layer = MoeLayerIndex(config_, request.layer);
  if (!moe_layer.ok()) {
    Reply(from, request.step_id, start, moe_layer.status());
    return;
  }
  if (request.width != config_.hidden_size) {
    Reply(from, request.step_id, start,
          absl::InvalidArgumentError(absl::StrCat("MoeRequest rows have width ", request.width,
                                                  "; the router takes hidden_size ",
                                                  config_.hidden_size)));
    return;
  }
  if (!placement_problem_.empty()) {
    Reply(from, request.step_id, start, absl::UnavailableError(placement_problem_));
    return;
  }
  if (request.tokens == 0) {
    Reply(from, request.step_id, start, absl::OkStatus());
    return;
  }

  auto step = std::make_unique<PendingStep>();
  step->id = next_step_id_++;
  step->origin = from;
  step->origin_step = request.step_id;
  step->model_layer = request.layer;
  step->start = start;
  // A worker answers for the time since its rows went out: a held step's wait was no worker's.
  step->timeout_at = (held ? absl::Now() : start) + options_.step_timeout;
  if (!request.traces.empty()) {
    step->traces = request.traces;
    step->span_id = NewSpanId();
  }
  const ExpertPlacement& placement = placement_.experts;
  const int layer = *moe_layer;
  // Tokens go to live replicas only: while every host of an expert lives, the placement's own
  // choice (the same on every router); otherwise the same rule over the live hosts.
  // A slow worker (router_core.h) counts as not live here, but does not fail the step.
  std::vector<bool> live(placement.num_workers);
  for (int w = 0; w < placement.num_workers; ++w) {
    live[w] = WorkerStatus(w).ok() && slow_.count(placement_.worker_nodes[w]) == 0;
  }
  PrepareRouterStep(routers_[request.layer], config_, rows.data(), request.tokens,
                    placement.num_workers,
                    [&placement, &live, layer](int32_t expert, int64_t token) {
                      const std::vector<int>& hosts = placement.WorkersFor(layer, expert);
                      std::vector<int> alive;
                      for (int h : hosts) {
                        if (live[h]) alive.push_back(h);
                      }
                      if (alive.size() == hosts.size() || alive.empty()) {
                        return placement.WorkerForToken(layer, expert, token);
                      }
                      return alive[static_cast<size_t>(token % static_cast<int64_t>(alive.size()))];
                    },
                    &step->step);

  const int workers = placement.num_workers;
  const std::vector<WorkerDispatch>& dispatch = step->step.plan.workers;
  // Before sending anything: a worker the tokens need is gone (no live replica either).
  for (int w = 0; w < workers; ++w) {
    if (dispatch[w].tokens.empty()) continue;
    if (absl::Status status = WorkerStatus(w); !status.ok()) {
      // A worker that only missed a step timeout still gets the rows nobody else can take: its
      // answer is what clears the suspicion, and the coordinator, which sees its heartbeats,
      // would never move its experts. Holding the step would wedge every step that needs it.
      if (OnlySuspected(placement_.worker_nodes[w])) continue;
      if (status.code() == absl::StatusCode::kAborted && !held) {
        // This router's own link is not up yet (NodeStatus): another router takes the layer. A
        // held step keeps waiting here instead: its new host's link is coming up.
        Reply(from, request.step_id, start, status);
      } else {
        HoldOrFail(from, request.step_id, start, std::move(bytes), placement_.worker_nodes[w],
                   status);
      }
      return;
    }
  }
  // The step keeps the request (rows and all); its rows stay where they are in the buffer.
  const size_t rows_at =
      static_cast<size_t>(reinterpret_cast<const char*>(rows.data()) - bytes.data());
  step->request = std::move(bytes);
  const float* x = reinterpret_cast<const float*>(step->request.data() + rows_at);
  for (int w = 0; w < workers; ++w) step->AddSlot();
  if (has_replicas_) step->requests.resize(workers);
  std::vector<PeerId> unsent;  // nodes whose Send failed
  for (int w = 0; w < workers; ++w) {
    if (dispatch[w].tokens.empty()) continue;
    ExpertRequest expert_request;
    expert_request.step_id = SlotRequestId(step->id, static_cast<size_t>(w));
    expert_request.layer = request.layer;
    expert_request.placement_version = static_cast<uint64_t>(placement_.version());
    expert_request.rows_count = static_cast<int64_t>(dispatch[w].tokens.size());
    expert_request.width = static_cast<int32_t>(step->step.width);
    expert_request.assignments = dispatch[w].assignments;
    for (const TraceContext& trace : step->traces) {
      expert_request.traces.push_back(trace.WithSpan(step->span_id));
    }
    const PeerId node = placement_.worker_nodes[w];
    std::string bytes;  // the worker's rows are gathered straight into its message
    GatherWorkerRows(step->step, x, w, EncodeLeavingRows(expert_request, &bytes));
    if (has_replicas_) step->requests[w] = bytes;
    if (absl::Status sent = transport_->Send(node, std::move(bytes)); !sent.ok()) {
      // The link died after the liveness check above (its failure is not yet polled): with
      // replicas the rows go there below; without, the step fails. Answers to what was already
      // sent then arrive for a step no longer pending and are dropped.
      if (!has_replicas_) {
        HoldOrFail(from, request.step_id, start, std::move(step->request), node,
                   absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: ",
                                                       sent.message())));
        return;
      }
      LOG(WARNING) << "cannot send step rows to " << WorkerName(node) << ": " << sent
                   << "; they go to replicas";
      unsent.push_back(node);
    }
    step->nodes[w] = node;
    ++step->outstanding;
  }
  for (PeerId node : unsent) {
    if (!SendToReplicas(*step, node)) {
      HoldOrFail(from, request.step_id, start, std::move(step->request), node,
                 absl::UnavailableError(absl::StrCat(
                     WorkerName(node), " lost: its rows could not be sent, and no live replica "
                                       "takes them")));
      return;
    }
  }
  // Recorded once the step went out: a step held (and planned again later) counts once.
  stats_->Record(layer, step->step.routing);
  if (metrics_ != nullptr) {
    const std::string label = absl::StrCat(layer);
    metrics_->tokens.WithLabels({label})->Increment(static_cast<double>(request.tokens));
    metrics_->max_vio.WithLabels({label})->Set(stats_->MaxVio(layer));
    if (!metrics_->expert_tokens.empty()) {
      // Count per expert first: one atomic add per expert, not per (token, expert).
      std::vector<int64_t> counts(metrics_->expert_tokens.size(), 0);
      for (int32_t e : step->step.routing.experts) ++counts[e];
      for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] > 0) metrics_->expert_tokens[e]->Increment(static_cast<double>(counts[e]));
      }
    }
  }
  step->dispatched = absl::Now();
  step->deadline = StepDeadline(step->dispatched, step->timeout_at);
  pending_.Add(std::move(step));
}

absl::Time RouterCore::StepDeadline(absl::Time now, absl::Time timeout_at) const {
  // Without replicas there is nowhere to send rows again: only the step timeout counts.
  if (!has_replicas_) return timeout_at;
  return std::min(timeout_at, now + expert_deadline_.deadline());
}

void RouterCore::HandleExpertResponse(PeerId from, MessageBytes bytes) {
  if (auto suspect = suspects_.find(from); suspect != suspects_.end()) {
    LOG(INFO) << WorkerName(from) << " answers again; it no longer counts as lost";
    suspects_.erase(suspect);
  }
  if (slow_.erase(from) > 0) {
    LOG(INFO) << WorkerName(from) << " answers again; new steps may send it rows";
  }
  PendingSteps::Answer answer = pending_.OnAnswer(from, std::move(bytes));
  switch (answer.outcome) {
    case PendingSteps::Outcome::kDropped:
      VLOG(1) << "dropping a late or unexpected answer from " << WorkerName(from);
      return;
    case PendingSteps::Outcome::kWaiting:
      return;
    case PendingSteps::Outcome::kComplete:
      if (!answer.step->resent) expert_deadline_.Record(absl::Now() - answer.step->dispatched);
      Finish(std::move(answer.step));
      return;
    case PendingSteps::Outcome::kFailed:
      Fail(*answer.step, absl::Status(answer.error.code(), absl::StrCat(WorkerName(from), ": ",
                                                                        answer.error.message())));
      return;
  }
}

void RouterCore::Finish(std::unique_ptr<PendingStep> step) {
  const absl::Time combine = absl::Now();
  std::vector<const float*> partials;
  for (size_t slot = 0; slot < step->answers.size(); ++slot) {
    partials.push_back(step->Partial(slot));
  }
  MoeResponse response;  // the sums are combined straight into the answer's message
  response.step_id = step->origin_step;
  response.tokens = step->step.tokens;
  response.width = static_cast<int32_t>(step->step.width);
  std::string message;
  FinishRouterStep(routers_[step->model_layer], config_, step->step, partials,
                   EncodeLeavingRows(response, &message));
  const absl::Time end = absl::Now();
  const absl::Duration compute = (step->dispatched - step->start) + (end - combine);
  if (metrics_ != nullptr) {
    metrics_->step_compute->Observe(absl::ToDoubleSeconds(compute));
    metrics_->step_expert_wait->Observe(absl::ToDoubleSeconds(combine - step->dispatched));
  }
  RecordSpans(*step, end, compute, combine - step->dispatched, /*ok=*/true);
  SendAnswer(step->origin, step->origin_step, step->start, absl::StatusCode::kOk,
             std::move(message));
}

void RouterCore::RecordSpans(const PendingStep& step, absl::Time end, absl::Duration compute,
                             absl::Duration expert_wait, bool ok) {
  if (options_.spans == nullptr) return;
  for (const TraceContext& trace : step.traces) {
    Span span;
    span.name = "k3.router.layer";
    span.context = trace.WithSpan(step.span_id);
    span.parent = trace.span_id;
    span.start = step.start;
    span.end = end;
    span.attributes = {{"k3.layer", static_cast<double>(step.model_layer)},
                       {"k3.tokens", static_cast<double>(step.step.tokens)},
                       {"k3.ok", ok ? 1.0 : 0.0},
                       {"k3.compute_ms", absl::ToDoubleMilliseconds(compute)},
                       {"k3.expert_wait_ms", absl::ToDoubleMilliseconds(expert_wait)},
                       {"k3.resent", step.resent ? 1.0 : 0.0}};
    options_.spans->Record(span);
  }
}

void RouterCore::Fail(const PendingStep& step, const absl::Status& status) {
  const absl::Time now = absl::Now();
  RecordSpans(step, now, step.dispatched - step.start, now - step.dispatched, /*ok=*/false);
  Reply(step.origin, step.origin_step, step.start, status);
}

void RouterCore::FailHeld(PeerId origin, uint64_t origin_step, absl::Time start,
                          std::string_view request, const absl::Status& status) {
  PendingStep step;
  step.origin = origin;
  step.origin_step = origin_step;
  step.start = start;
  step.dispatched = start;  // no compute: it waited for a live host of its experts
  MoeRequest header;
  absl::Span<const float> rows;
  if (options_.spans != nullptr && DecodeInPlace(request, &header, &rows).ok() &&
      !header.traces.empty()) {
    step.traces = std::move(header.traces);
    step.span_id = NewSpanId();
    step.model_layer = header.layer;
    step.step.tokens = header.tokens;
  }
  Fail(step, status);
}

void RouterCore::ExpireSteps(absl::Time now) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeExpired(now)) {
    const std::vector<PeerId> late = PendingSteps::Unanswered(*step);
    if (now < step->timeout_at) {
      // The expert deadline: the late workers are slow; their rows go to replicas where they can.
      // Rows without one keep waiting until the step timeout.
      std::vector<PeerId> slow;
      bool all_resent = true;
      for (PeerId node : late) {
        const bool resent = SendToReplicas(*step, node);
        all_resent = all_resent && resent;
        if (resent) slow.push_back(node);
      }
      step->resent = step->resent || !slow.empty();
      step->deadline = all_resent ? StepDeadline(now, step->timeout_at) : step->timeout_at;
      pending_.Add(std::move(step));
      for (PeerId node : slow) {
        if (slow_.insert(node).second) {
          LOG(WARNING) << WorkerName(node) << " did not answer a step within the expert deadline "
                       << "of " << absl::FormatDuration(expert_deadline_.deadline())
                       << "; its rows go to replicas until it answers again";
        }
        ResendWaitingOnSlow(node);
      }
      continue;
    }
    std::vector<std::string> messages;
    for (PeerId node : late) {
      auto member = members_.find(static_cast<uint32_t>(node));
      Suspect& suspect = suspects_[node];
      suspect.incarnation = member == members_.end() ? 0 : member->second.node().incarnation();
      suspect.reason = absl::StrCat("no answer to a step of layer ", step->model_layer, " within ",
                                    absl::FormatDuration(options_.step_timeout));
      LOG(WARNING) << WorkerName(node) << ": " << suspect.reason
                   << "; it counts as lost until it answers again";
      messages.push_back(std::string(NodeStatus(node).message()));
    }
    bool resent = true;
    for (PeerId node : late) resent = resent && SendToReplicas(*step, node);
    if (resent) {
      step->resent = true;
      step->timeout_at = now + options_.step_timeout;
      step->deadline = StepDeadline(now, step->timeout_at);
      pending_.Add(std::move(step));
    } else {
      Fail(*step, absl::UnavailableError(absl::StrJoin(messages, "; ")));
    }
    for (PeerId node : late) FailWaitingOn(node, NodeStatus(node));
  }
}

bool RouterCore::SendToReplicas(PendingStep& step, PeerId node) {
  if (step.requests.size() != step.nodes.size()) return false;
  absl::StatusOr<int> layer = MoeLayerIndex(config_, step.model_layer);
  if (!layer.ok() || !placement_.placed()) return false;
  const ExpertPlacement& placement = placement_.experts;
  auto usable = [&](int r) {
    const PeerId candidate = placement_.worker_nodes[r];
    return candidate != node && NodeStatus(candidate).ok() && slow_.count(candidate) == 0;
  };
  // Slots added by SplitToReplicas are not visited again here (they go to other nodes).
  const size_t slots = step.nodes.size();
  for (size_t w = 0; w < slots; ++w) {
    if (step.nodes[w] != node || step.answered[w]) continue;
    if (step.requests[w].empty()) return false;
    // A live worker holding every expert the slot's rows need: it computes the same partials.
    const std::vector<ExpertAssignment>& assignments = step.step.plan.workers[w].assignments;
    int target = -1;
    for (int r = 0; r < placement.num_workers && target < 0; ++r) {
      if (!usable(r)) continue;
      bool hosts_all = true;
      for (const ExpertAssignment& a : assignments) {
        const std::vector<int>& hosts = placement.WorkersFor(*layer, a.expert);
        if (!std::binary_search(hosts.begin(), hosts.end(), r)) {
          hosts_all = false;
          break;
        }
      }
      if (hosts_all) target = r;
    }
    if (target < 0) {
      // No one worker holds them all: split the rows over live hosts of each expert.
      if (!SplitToReplicas(step, w, *layer, usable)) return false;
      LOG_EVERY_N(WARNING, 20) << "step " << step.id << " of layer " << step.model_layer
                               << ": the rows for " << WorkerName(node)
                               << " went again to several replicas (every 20th logged)";
      continue;
    }
    const PeerId replica = placement_.worker_nodes[target];
    if (!transport_->Send(replica, step.requests[w]).ok()) return false;
    LOG_EVERY_N(WARNING, 20) << "step " << step.id << " of layer " << step.model_layer
                             << ": the rows for " << WorkerName(node) << " went again to "
                             << WorkerName(replica) << " (every 20th logged)";
    step.nodes[w] = replica;
    step.resent = true;
  }
  return true;
}

bool RouterCore::SplitToReplicas(PendingStep& step, size_t slot, int moe_layer,
                                 const std::function<bool(int)>& usable) {
  const ExpertPlacement& placement = placement_.experts;
  ExpertRequest original;
  if (!Decode(step.requests[slot], &original).ok()) return false;
  const WorkerDispatch& dispatch = step.step.plan.workers[slot];
  // Target worker -> the slot's assignments it takes: the first usable host of each expert.
  std::map<int, std::vector<ExpertAssignment>> by_target;
  for (const ExpertAssignment& a : dispatch.assignments) {
    const std::vector<int>& hosts = placement.WorkersFor(moe_layer, a.expert);
    auto host = std::find_if(hosts.begin(), hosts.end(), usable);
    if (host == hosts.end()) return false;
    by_target[*host].push_back(a);
  }
  const int64_t width = step.step.width;
  std::vector<std::pair<PeerId, std::string>> requests;
  std::vector<WorkerDispatch> dispatches;
  for (auto& [target, assignments] : by_target) {
    // The rows these assignments name, in the slot's order, renumbered.
    std::map<int32_t, int32_t> rows;  // slot row -> new row
    for (const ExpertAssignment& a : assignments) rows.emplace(a.row, 0);
    WorkerDispatch part;
    ExpertRequest request;
    // The new slots go after the existing ones, in this order.
    const size_t new_slot = step.nodes.size() + requests.size();
    if (new_slot >= kMaxSlots) return false;
    request.step_id = SlotRequestId(step.id, new_slot);
    request.layer = step.model_layer;
    request.placement_version = original.placement_version;
    request.width = original.width;
    request.traces = original.traces;
    for (auto& [row, renumbered] : rows) {
      renumbered = static_cast<int32_t>(part.tokens.size());
      part.tokens.push_back(dispatch.tokens[row]);
      request.rows.insert(request.rows.end(), original.rows.begin() + row * width,
                          original.rows.begin() + (row + 1) * width);
    }
    for (ExpertAssignment a : assignments) {
      a.row = rows[a.row];
      part.assignments.push_back(a);
    }
    request.rows_count = static_cast<int64_t>(part.tokens.size());
    request.assignments = part.assignments;
    requests.emplace_back(placement_.worker_nodes[target], Encode(request));
    dispatches.push_back(std::move(part));
  }
  // The slot answers nothing now; one new slot per target does.
  step.step.plan.workers[slot] = WorkerDispatch();
  step.answers[slot] = MessageBytes();
  step.answered[slot] = true;
  step.requests[slot].clear();
  --step.outstanding;
  step.resent = true;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PeerId target = requests[i].first;
    std::string bytes = requests[i].second;
    step.step.plan.workers.push_back(std::move(dispatches[i]));
    step.AddSlot();
    step.nodes.back() = target;
    step.requests.push_back(std::move(requests[i].second));
    ++step.outstanding;
    if (!transport_->Send(target, std::move(bytes)).ok()) return false;
  }
  return true;
}

void RouterCore::ResendWaitingOnSlow(PeerId node) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeWaitingOn(node)) {
    // Rows that find no replica stay with the node (SendToReplicas changes only resent slots).
    if (SendToReplicas(*step, node)) step->resent = true;
    pending_.Add(std::move(step));
  }
}

void RouterCore::FailWaitingOn(PeerId node, const absl::Status& status) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeWaitingOn(node)) {
    if (SendToReplicas(*step, node)) {
      step->resent = true;
      pending_.Add(std::move(step));
      continue;
    }
    // Answers to what the step sent elsewhere come for a step no longer pending: dropped.
    HoldOrFail(step->origin, step->origin_step, step->start, std::move(step->request), node,
               status);
  }
}

void RouterCore::FailAll(const absl::Status& status) {
  for (std::unique_ptr<PendingStep>& step : pending_.TakeAll()) Fail(*step, status);
  for (const Held& h : held_) FailHeld(h.origin, h.origin_step, h.start, h.request, status);
  held_.clear();
  holding_for_.clear();
}

void RouterCore::Reply(PeerId origin, uint64_t origin_step, absl::Time start,
                       absl::Status status) {
  MoeResponse response;
  response.step_id = origin_step;
  if (status.ok()) {
    response.width = config_.ExpertWidth();  // a step of no tokens
  } else {
    LOG_EVERY_N(WARNING, 100) << "step " << origin_step << " of attention peer " << origin
                              << " failed (failure " << google::COUNTER
                              << ", every 100th logged): " << status;
  }
  response.status = std::move(status);
  SendAnswer(origin, origin_step, start, response.status.code(), Encode(response));
}

void RouterCore::SendAnswer(PeerId origin, uint64_t origin_step, absl::Time start,
                            absl::StatusCode code, std::string message) {
  if (metrics_ != nullptr) {
    metrics_->steps.WithLabels({absl::StatusCodeToString(code)})->Increment();
    metrics_->step_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (absl::Status sent = transport_->Send(origin, std::move(message)); !sent.ok()) {
    LOG_EVERY_N(WARNING, 100) << "cannot answer step " << origin_step << " of attention peer "
                              << origin << ": " << sent;
  }
}

void RouterCore::UpdateReadiness() {
  absl::Status ready;
  if (!placement_problem_.empty()) {
    ready = absl::UnavailableError(placement_problem_);
  } else {
    // Ready while every expert has a live host (a dead worker's replicas take its rows).
    const ExpertPlacement& placement = placement_.experts;
    std::vector<absl::Status> workers;
    bool all_live = true;
    for (int w = 0; w < placement.num_workers; ++w) {
      workers.push_back(WorkerStatus(w));
      all_live = all_live && workers.back().ok();
    }
    for (int layer = 0; layer < placement.num_layers() && !all_live && ready.ok(); ++layer) {
      for (int e = 0; e < placement.num_experts && ready.ok(); ++e) {
        const std::vector<int>& hosts = placement.WorkersFor(layer, e);
        if (std::none_of(hosts.begin(), hosts.end(), [&](int h) { return workers[h].ok(); })) {
          ready = workers[hosts[0]];
        }
      }
    }
  }
  readiness_ = std::move(ready);
}

absl::Status RouterCore::Readiness() const { return readiness_; }

int64_t RouterCore::placement_version() const { return placement_.version(); }

pb::LoadStatsResponse RouterCore::LoadStats(bool reset) {
  return stats_->Snapshot(reset, placement_version());
}

}  // namespace k3
