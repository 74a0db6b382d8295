#include "router/router_core.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "kernels/thread_pool.h"
#include "moe/moe_layer_map.h"
#include "moe/moe_wire.h"
#include "router/router_metrics.h"
#include "router/router_step.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

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
  K3_ASSIGN_OR_RETURN(std::unique_ptr<RouterLoadStats> stats,
                      RouterLoadStats::Create(config.num_experts, config.num_experts_per_token,
                                              bias, options.qb_bins));
  return std::unique_ptr<RouterCore>(
      new RouterCore(weights, transport, links, options, std::move(stats), metrics));
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
      metrics_(metrics != nullptr
                   ? std::make_unique<RouterMetrics>(
                         metrics, options.per_expert_metrics ? weights->config.num_experts : 0)
                   : nullptr),
      placement_problem_("no cluster state from the coordinator yet"),
      expert_deadline_(options.expert_retry_floor, options.expert_retry_p99_factor) {
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
  if (metrics_ != nullptr) metrics_->SetPending(pending_.size());
  return absl::OkStatus();
}

absl::Status RouterCore::SetBias(int moe_layer, std::vector<float> bias) {
  K3_ASSIGN_OR_RETURN(int layer, ModelLayerOfMoe(config_, moe_layer));
  if (static_cast<int>(bias.size()) != config_.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("a bias of ", bias.size(), " values for ",
                                                   config_.num_experts, " experts"));
  }
  for (float b : bias) {
    if (!std::isfinite(b)) return absl::InvalidArgumentError("the bias is not finite");
  }
  LOG(INFO) << "MoE layer " << moe_layer << " routes with a new e_score_correction_bias "
            << "(online bias: the model's outputs change)";
  routers_[layer].score_bias = bias;
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
    absl::StatusOr<ClusterPlacement> placement =
        ClusterPlacementForModel(proto, config_.num_experts, config_.NumMoeLayers());
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

absl::Status RouterCore::CheckMoeRequest(const MoeRequest& request) const {
  if (absl::StatusOr<int> moe_layer = MoeLayerIndex(config_, request.layer); !moe_layer.ok()) {
    return moe_layer.status();
  }
  if (request.width != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRequest rows have width ", request.width,
                                                   "; the router takes hidden_size ",
                                                   config_.hidden_size));
  }
  if (!placement_problem_.empty()) return absl::UnavailableError(placement_problem_);
  return absl::OkStatus();
}

void RouterCore::HandleMoeRequest(PeerId from, MessageBytes bytes, absl::Time start,
                                  bool held) {
  MoeRequest request;
  absl::Span<const float> rows;  // read in place, inside `bytes`
  absl::Status checked = DecodeInPlace(bytes, &request, &rows);
  if (checked.ok()) checked = CheckMoeRequest(request);
  if (!checked.ok() || request.tokens == 0) {
    // Decode reads the step id first: the attention worker can match the answer if it got there.
    Reply(from, request.step_id, start, checked);  // OK: a step of no tokens
    return;
  }
  std::unique_ptr<PendingStep> step = PlanStep(from, request, rows.data(), start, held);
  // Before sending anything: a worker the tokens need is gone (no live replica either).
  const std::vector<WorkerDispatch>& dispatch = step->step.plan.workers;
  for (size_t w = 0; w < dispatch.size(); ++w) {
    if (dispatch[w].tokens.empty()) continue;
    const PeerId node = placement_.worker_nodes[w];
    absl::Status status = WorkerStatus(static_cast<int>(w));
    // A worker that only missed a step timeout still gets the rows nobody else can take: its
    // answer is what clears the suspicion, and the coordinator, which sees its heartbeats,
    // would never move its experts. Holding the step would wedge every step that needs it.
    if (status.ok() || OnlySuspected(node)) continue;
    if (status.code() == absl::StatusCode::kAborted && !held) {
      // This router's own link is not up yet (NodeStatus): another router takes the layer. A
      // held step keeps waiting here instead: its new host's link is coming up.
      Reply(from, request.step_id, start, status);
    } else {
      HoldOrFail(from, request.step_id, start, std::move(bytes), node, status);
    }
    return;
  }
  // The step keeps the request (rows and all); its rows stay where they are in the buffer.
  const size_t rows_at =
      static_cast<size_t>(reinterpret_cast<const char*>(rows.data()) - bytes.data());
  step->request = std::move(bytes);
  PeerId lost = 0;
  if (absl::Status sent = Dispatch(*step, rows_at, &lost); !sent.ok()) {
    HoldOrFail(from, request.step_id, start, std::move(step->request), lost, sent);
    return;
  }
  RecordRouted(*step);
  step->dispatched = absl::Now();
  step->deadline = StepDeadline(step->dispatched, step->timeout_at);
  pending_.Add(std::move(step));
}

std::unique_ptr<PendingStep> RouterCore::PlanStep(PeerId from, const MoeRequest& request,
                                                  const float* rows, absl::Time start,
                                                  bool held) {
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
  const int layer = *MoeLayerIndex(config_, request.layer);
  // Tokens go to live replicas only: while every host of an expert lives, the placement's own
  // choice (the same on every router); otherwise the same rule over the live hosts.
  // A slow worker (router_core.h) counts as not live here, but does not fail the step.
  std::vector<bool> live(placement.num_workers);
  for (int w = 0; w < placement.num_workers; ++w) {
    live[w] = WorkerStatus(w).ok() && slow_.count(placement_.worker_nodes[w]) == 0;
  }
  PrepareRouterStep(routers_[request.layer], config_, rows, request.tokens,
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
  return step;
}

absl::Status RouterCore::Dispatch(PendingStep& step, size_t rows_at, PeerId* lost) {
  const float* x = reinterpret_cast<const float*>(step.request.data() + rows_at);
  const std::vector<WorkerDispatch>& dispatch = step.step.plan.workers;
  const int workers = static_cast<int>(dispatch.size());
  for (int w = 0; w < workers; ++w) step.AddSlot();
  if (has_replicas_) step.requests.resize(workers);
  std::vector<PeerId> unsent;  // nodes whose Send failed
  for (int w = 0; w < workers; ++w) {
    if (dispatch[w].tokens.empty()) continue;
    ExpertRequest expert_request;
    expert_request.step_id = SlotRequestId(step.id, static_cast<size_t>(w));
    expert_request.layer = step.model_layer;
    expert_request.placement_version = static_cast<uint64_t>(placement_.version());
    expert_request.rows_count = static_cast<int64_t>(dispatch[w].tokens.size());
    expert_request.width = static_cast<int32_t>(step.step.width);
    expert_request.assignments = dispatch[w].assignments;
    for (const TraceContext& trace : step.traces) {
      expert_request.traces.push_back(trace.WithSpan(step.span_id));
    }
    const PeerId node = placement_.worker_nodes[w];
    std::string bytes;  // the worker's rows are gathered straight into its message
    GatherWorkerRows(step.step, x, w, EncodeLeavingRows(expert_request, &bytes));
    if (has_replicas_) step.requests[w] = bytes;
    if (absl::Status sent = transport_->Send(node, std::move(bytes)); !sent.ok()) {
      // The link died after the liveness check (its failure is not yet polled): with replicas
      // the rows go there below; without, the step is held. Answers to what was already sent
      // then arrive for a step no longer pending and are dropped.
      if (!has_replicas_) {
        *lost = node;
        return absl::UnavailableError(absl::StrCat(WorkerName(node), " lost: ", sent.message()));
      }
      LOG(WARNING) << "cannot send step rows to " << WorkerName(node) << ": " << sent
                   << "; they go to replicas";
      unsent.push_back(node);
    }
    step.nodes[w] = node;
    ++step.outstanding;
  }
  for (PeerId node : unsent) {
    if (!SendToReplicas(step, node)) {
      *lost = node;
      return absl::UnavailableError(absl::StrCat(
          WorkerName(node), " lost: its rows could not be sent, and no live replica takes them"));
    }
  }
  return absl::OkStatus();
}

void RouterCore::RecordRouted(const PendingStep& step) {
  // Recorded once the step went out: a step held (and planned again later) counts once.
  const int layer = *MoeLayerIndex(config_, step.model_layer);
  stats_->Record(layer, step.step.routing);
  if (metrics_ != nullptr) {
    metrics_->CountRouted(layer, step.step.tokens, stats_->MaxVio(layer), step.step.routing.experts);
  }
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
  if (metrics_ != nullptr) metrics_->ObserveAnswered(compute, combine - step->dispatched);
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
  if (metrics_ != nullptr) metrics_->CountAnswer(code, absl::Now() - start);
  if (absl::Status sent = transport_->Send(origin, std::move(message)); !sent.ok()) {
    LOG_EVERY_N(WARNING, 100) << "cannot answer step " << origin_step << " of attention peer "
                              << origin << ": " << sent;
  }
}

absl::Status RouterCore::Readiness() const { return readiness_; }

int64_t RouterCore::placement_version() const { return placement_.version(); }

pb::LoadStatsResponse RouterCore::LoadStats(bool reset) {
  return stats_->Snapshot(reset, placement_version());
}

}  // namespace k3
