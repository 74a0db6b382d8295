#include "coordinator/coordinator_balancer.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "coordinator/expert_placement_planner.h"
#include "coordinator/online_bias.h"
#include "glog/logging.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// Experts per layer each worker may hold: its share of a contiguous placement over the nodes'
// declared slots (what it held before any rebalancing), plus the spare slots.
std::vector<int> WorkerSlots(const ExpertPlacement& current, const std::vector<int>& declared,
                             int spare) {
  absl::StatusOr<ExpertPlacement> shares = ContiguousPlacement(1, current.num_experts, declared);
  std::vector<int> slots;
  for (int w = 0; w < current.num_workers; ++w) {
    int share = 0;
    if (shares.ok()) {
      share = static_cast<int>(shares->ExpertsOn(w, 0).size());
    } else {
      for (int l = 0; l < current.num_layers(); ++l) {
        share = std::max(share, static_cast<int>(current.ExpertsOn(w, l).size()));
      }
    }
    slots.push_back(share + spare);
  }
  return slots;
}

// The expert slots each worker node of `current` declared, by worker; FAILED_PRECONDITION when
// one of them is not alive in `state`.
absl::StatusOr<std::vector<int>> DeclaredSlots(const pb::ClusterState& state,
                                               const ClusterPlacement& current) {
  std::map<uint32_t, const pb::Member*> members;
  for (const pb::Member& m : state.members()) members[m.node().node_id()] = &m;
  std::vector<int> declared;
  for (uint32_t node : current.worker_nodes) {
    auto it = members.find(node);
    if (it == members.end() || it->second->state() != pb::ALIVE) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker node ", node, " of placement version ", current.version(), " is not alive"));
    }
    declared.push_back(it->second->node().expert_slots());
  }
  return declared;
}

}  // namespace

absl::Status LoadBalancerOptions::Validate() const {
  const std::pair<const char*, absl::Duration> intervals[] = {
      {"gather_interval", gather_interval},
      {"rebalance_interval", rebalance_interval},
      {"online_bias_interval", online_bias_interval},
      {"retire_delay", retire_delay}};
  for (const auto& [name, value] : intervals) {
    if (value < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must not be negative"));
    }
  }
  const std::pair<const char*, absl::Duration> timeouts[] = {{"rpc_timeout", rpc_timeout},
                                                             {"load_timeout", load_timeout},
                                                             {"switch_timeout", switch_timeout}};
  for (const auto& [name, value] : timeouts) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be positive"));
    }
  }
  if (spare_slots_per_worker < 0) {
    return absl::InvalidArgumentError("spare_slots_per_worker must not be negative");
  }
  if (!(min_improvement >= 0 && min_improvement < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_improvement is ", min_improvement, "; must be in [0, 1)"));
  }
  return absl::OkStatus();
}

struct LoadBalancer::Metrics {
  explicit Metrics(MetricsRegistry* r)
      : expert_max_vio(r->AddGauge("k3_coordinator_expert_load_max_vio",
                                   "(max - mean) / mean tokens per expert over the coordinator's "
                                   "load window, by MoE layer",
                                   {"layer"})),
        worker_max_vio(r->AddGauge("k3_coordinator_worker_load_max_vio",
                                   "(max - mean) / mean expected tokens per expert worker under "
                                   "the current placement, by MoE layer",
                                   {"layer"})),
        window_tokens(r->AddGauge("k3_coordinator_window_tokens",
                                  "Tokens routed in the load window, summed over MoE layers")
                          .Get()),
        gathers(r->AddCounter("k3_coordinator_load_gathers_total",
                              "RouterControl.GetLoadStats calls, by status code", {"code"})),
        rebalances(r->AddCounter("k3_coordinator_rebalances_total",
                                 "Rebalancing decisions: rolled_out, unchanged or failed",
                                 {"outcome"})),
        bias_pushes(r->AddCounter("k3_coordinator_bias_pushes_total",
                                  "RouterControl.SetBias calls (online bias), by status code",
                                  {"code"})),
        resizes(r->AddCounter("k3_coordinator_resizes_total",
                              "Expert worker-set changes (joins, drains, lost experts): "
                              "rolled_out or failed",
                              {"outcome"})) {}

  MetricFamily<Gauge>& expert_max_vio;
  MetricFamily<Gauge>& worker_max_vio;
  Gauge* window_tokens;
  MetricFamily<Counter>& gathers;
  MetricFamily<Counter>& rebalances;
  MetricFamily<Counter>& bias_pushes;
  MetricFamily<Counter>& resizes;
};

LoadBalancer::LoadBalancer(const LoadBalancerOptions& options, int num_layers, int num_experts,
                           PlacementControl* control, MetricsRegistry* metrics)
    : options_(options),
      control_(control),
      metrics_(std::make_unique<Metrics>(metrics)),
      calls_(options.tls),
      window_(num_layers, num_experts, absl::Now()),
      rollout_({.rpc_timeout = options.rpc_timeout,
                .load_timeout = options.load_timeout,
                .switch_timeout = options.switch_timeout,
                .retire_delay = options.retire_delay},
               control, &calls_, &actor_),
      actor_("balancer") {
  const absl::Status valid = options_.Validate();
  CHECK(valid.ok()) << valid;
  SchedulePeriodicWork();
}

LoadBalancer::~LoadBalancer() { Stop(); }

void LoadBalancer::Stop() {
  calls_.Stop();
  actor_.Stop();
}

void LoadBalancer::SchedulePeriodic(absl::Duration interval, std::function<void()> work) {
  if (interval == absl::ZeroDuration()) return;
  actor_.PostAfter(interval, [this, interval, work = std::move(work)] {
    if (calls_.stopped()) return;
    work();
    SchedulePeriodic(interval, work);
  });
}

void LoadBalancer::SchedulePeriodicWork() {
  SchedulePeriodic(options_.gather_interval, [this] {
    if (absl::Status gathered = Gather(nullptr); !gathered.ok()) {
      LOG_EVERY_N(WARNING, 10) << "gathering expert load: " << gathered;
    }
  });
  SchedulePeriodic(options_.rebalance_interval, [this] {
    DoRebalance(/*force=*/false, [](absl::StatusOr<pb::RebalanceResponse> outcome) {
      if (!outcome.ok()) {
        LOG(WARNING) << "rebalancing: " << outcome.status();
      } else if (!outcome->rolled_out()) {
        VLOG(1) << "rebalancing: nothing rolled out: " << outcome->reason();
      }
    });
  });
  SchedulePeriodic(options_.online_bias_interval, [this] { PushBias(); });
  SchedulePeriodic(options_.resize_interval, [this] { Resize(); });
}

absl::Status LoadBalancer::Gather(pb::ClusterState* state_out) {
  K3_ASSIGN_OR_RETURN(pb::ClusterState state,
                      control_->ClusterStateSnapshot(absl::Now() + options_.rpc_timeout));
  const std::vector<NodeAddress> routers = AliveMembers(state, pb::ROLE_ROUTER);
  pb::GetLoadStatsRequest request;
  request.set_reset(true);
  std::vector<absl::StatusOr<pb::LoadStatsResponse>> answers = calls_.CallAll<pb::LoadStatsResponse>(
      Addresses(routers), options_.rpc_timeout,
      [&request](const std::shared_ptr<grpc::Channel>& channel, size_t,
                 grpc::ClientContext* context, pb::LoadStatsResponse* response,
                 std::function<void(grpc::Status)> done) {
        std::shared_ptr<pb::RouterControl::Stub> stub = pb::RouterControl::NewStub(channel);
        stub->async()->GetLoadStats(context, &request, response, std::move(done));
        return std::shared_ptr<void>(stub);
      });
  int answered = 0;
  int failed = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    absl::Status status = answers[i].status();
    if (status.ok()) status = window_.Add(*answers[i]);
    metrics_->gathers.WithLabels({absl::StatusCodeToString(answers[i].status().code())})
        ->Increment();
    if (status.ok()) {
      ++answered;
    } else {
      ++failed;
      LOG_EVERY_N(WARNING, 10) << "load statistics of router node " << routers[i].node << ": "
                               << status;
    }
  }
  absl::StatusOr<ClusterPlacement> placement = ClusterPlacementFromProto(state.placement());
  PublishReport(placement.ok() ? *placement : ClusterPlacement(), answered, failed);
  if (state_out != nullptr) *state_out = std::move(state);
  return absl::OkStatus();
}

void LoadBalancer::PublishReport(const ClusterPlacement& placement, int answered, int failed) {
  pb::LoadReport report = window_.Report(placement);
  report.set_gathered_unix_ms(absl::ToUnixMillis(absl::Now()));
  report.set_routers(answered);
  report.set_routers_failed(failed);
  report.set_rebalances(rebalances_);
  uint64_t tokens = 0;
  for (const pb::LayerLoadReport& layer : report.layers()) {
    const std::string label = absl::StrCat(layer.layer());
    metrics_->expert_max_vio.WithLabels({label})->Set(layer.expert_max_vio());
    metrics_->worker_max_vio.WithLabels({label})->Set(layer.worker_max_vio());
    tokens += layer.tokens();
  }
  metrics_->window_tokens->Set(static_cast<double>(tokens));
  absl::MutexLock lock(&mu_);
  report_ = std::move(report);
}

pb::LoadReport LoadBalancer::LastReport() const {
  absl::MutexLock lock(&mu_);
  return report_;
}

void LoadBalancer::GetLoadReport(bool refresh,
                                 std::function<void(absl::StatusOr<pb::LoadReport>)> done) {
  if (!refresh) {
    std::optional<pb::LoadReport> report;
    {
      absl::MutexLock lock(&mu_);
      if (report_.gathered_unix_ms() != 0) report = report_;  // else nothing gathered yet
    }
    if (report.has_value()) {
      done(*std::move(report));
      return;
    }
  }
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  const bool posted = actor_.Post([this, shared_done] {
    if (calls_.stopped()) {
      (*shared_done)(absl::UnavailableError("the coordinator is stopping"));
      return;
    }
    if (absl::Status gathered = Gather(nullptr); !gathered.ok()) {
      (*shared_done)(gathered);
      return;
    }
    (*shared_done)(LastReport());
  });
  if (!posted) (*shared_done)(absl::UnavailableError("the coordinator is stopping"));
}

void LoadBalancer::Rebalance(bool force,
                             std::function<void(absl::StatusOr<pb::RebalanceResponse>)> done) {
  auto shared_done = std::make_shared<decltype(done)>(std::move(done));
  const bool posted = actor_.Post([this, force, shared_done] {
    if (calls_.stopped()) {
      (*shared_done)(absl::UnavailableError("the coordinator is stopping"));
      return;
    }
    DoRebalance(force, *shared_done);
  });
  if (!posted) (*shared_done)(absl::UnavailableError("the coordinator is stopping"));
}

void LoadBalancer::DoRebalance(bool force, RebalanceDone done) {
  if (rolling_out_) {
    done(absl::AbortedError("another placement is being rolled out; try again"));
    return;
  }
  Rollout rollout;
  absl::StatusOr<pb::RebalanceResponse> planned = PlanRebalance(force, &rollout);
  if (!planned.ok() || !rollout.next.placed()) {
    done(std::move(planned));
    return;
  }
  rolling_out_ = true;
  const ClusterPlacement next = rollout.next;
  rollout_.RollOut(
      next, rollout.base_version, rollout.state, absl::StrCat("placement version ", next.version()),
      [this, next, response = *std::move(planned), done = std::move(done)](
          absl::Status rolled) mutable {
        if (calls_.stopped()) {
          done(absl::UnavailableError("the coordinator is stopping"));
          return;
        }
        rolling_out_ = false;
        if (!rolled.ok()) {
          metrics_->rebalances.WithLabels({"failed"})->Increment();
          done(rolled);
          return;
        }
        ++rebalances_;
        metrics_->rebalances.WithLabels({"rolled_out"})->Increment();
        window_.Reset(absl::Now());
        PublishReport(next, 0, 0);
        response.set_rolled_out(true);
        response.set_placement_version(next.version());
        done(std::move(response));
      });
}

absl::StatusOr<pb::RebalanceResponse> LoadBalancer::PlanRebalance(bool force, Rollout* rollout) {
  pb::ClusterState state;
  K3_RETURN_IF_ERROR(Gather(&state));
  K3_ASSIGN_OR_RETURN(ClusterPlacement current, ClusterPlacementFromProto(state.placement()));
  if (!current.placed()) {
    return absl::FailedPreconditionError("the cluster has no expert placement yet");
  }
  const ExpertPlacement& experts = current.experts;
  if (experts.num_layers() != window_.num_layers()) {
    return absl::FailedPreconditionError(absl::StrCat("the placement has ", experts.num_layers(),
                                                      " MoE layers; the model ",
                                                      window_.num_layers()));
  }
  K3_ASSIGN_OR_RETURN(std::vector<int> declared, DeclaredSlots(state, current));

  pb::RebalanceResponse response;
  response.set_placement_version(current.version());
  response.set_window_tokens(window_.total_tokens());
  auto unchanged = [&](std::string reason) {
    metrics_->rebalances.WithLabels({"unchanged"})->Increment();
    response.set_reason(std::move(reason));
    return response;
  };
  if (window_.total_tokens() == 0) return unchanged("no tokens were routed in the load window");

  const std::vector<std::vector<double>> loads = window_.ExpertLoads();
  K3_ASSIGN_OR_RETURN(
      PlacementPlan plan,
      PlanExpertPlacement(loads, WorkerSlots(experts, declared, options_.spare_slots_per_worker),
                          0));
  std::vector<double> before;
  for (int l = 0; l < experts.num_layers(); ++l) {
    before.push_back(WorkerMaxVio(ExpectedWorkerLoad(experts, l, loads[l])));
  }
  response.set_worker_max_vio_before(Mean(before));
  response.set_worker_max_vio_after(Mean(plan.max_vio));
  const double gain = response.worker_max_vio_before() - response.worker_max_vio_after();
  if (plan.placement.hosts == experts.hosts) {
    return unchanged("the plan equals the current placement");
  }
  if (!force && (gain <= 0 || gain < options_.min_improvement * response.worker_max_vio_before())) {
    return unchanged(
        absl::StrFormat("the plan would move the mean worker MaxVio only from %.4f to %.4f",
                        response.worker_max_vio_before(), response.worker_max_vio_after()));
  }

  const absl::Time reserve_deadline = absl::Now() + options_.rpc_timeout;
  absl::StatusOr<int64_t> version =
      control_->ReservePlacementVersion(current.version(), reserve_deadline);
  if (!version.ok()) {
    metrics_->rebalances.WithLabels({"failed"})->Increment();
    return version.status();
  }
  ClusterPlacement next;
  next.experts = plan.placement;
  next.experts.version = *version;
  next.worker_nodes = current.worker_nodes;
  LOG(INFO) << "rebalancing: placement version " << *version << " lowers the mean worker MaxVio "
            << "from " << response.worker_max_vio_before() << " to "
            << response.worker_max_vio_after() << " (" << window_.total_tokens()
            << " tokens in the window); loading its experts";

  rollout->next = std::move(next);
  rollout->base_version = current.version();
  rollout->state = std::move(state);
  return response;
}

void LoadBalancer::Resize() {
  if (rolling_out_ || absl::Now() < resize_after_) return;
  absl::StatusOr<std::optional<CoordinatorState::Resize>> plan =
      control_->PlanResize(absl::Now() + options_.rpc_timeout);
  if (!plan.ok() || !plan->has_value()) return;
  CoordinatorState::Resize& resize = **plan;
  absl::StatusOr<pb::ClusterState> state =
      control_->ClusterStateSnapshot(absl::Now() + options_.rpc_timeout);
  if (!state.ok()) return;
  // FAILED_PRECONDITION: the placement moved since the plan; plan again next time.
  absl::StatusOr<int64_t> version =
      control_->ReservePlacementVersion(resize.base_version, absl::Now() + options_.rpc_timeout);
  if (!version.ok()) return;
  resize.placement.experts.version = *version;
  const absl::Time start = absl::Now();
  LOG(INFO) << "resizing the expert tier (" << resize.why << "): placement version " << *version
            << " on expert nodes " << absl::StrJoin(resize.placement.worker_nodes, ",")
            << "; loading its experts";
  rolling_out_ = true;
  rollout_.RollOut(
      resize.placement, resize.base_version, *state, absl::StrCat("placement version ", *version),
      [this, resize, start, version = *version](absl::Status rolled) {
        if (calls_.stopped()) return;
        rolling_out_ = false;
        if (!rolled.ok()) {
          metrics_->resizes.WithLabels({"failed"})->Increment();
          LOG(WARNING) << "resizing the expert tier (" << resize.why << "): " << rolled;
          // ABORTED: the cluster moved meanwhile (a spare took over, a node died): plan again.
          // Other errors are the nodes' own, and name the cause of experts that stay lost.
          if (rolled.code() != absl::StatusCode::kAborted) {
            control_->ResizeFailed(resize.base_version, rolled);
            resize_after_ = absl::Now() + options_.resize_retry;
          }
          return;
        }
        metrics_->resizes.WithLabels({"rolled_out"})->Increment();
        LOG(INFO) << "resized the expert tier (" << resize.why << ") in "
                  << absl::FormatDuration(absl::Now() - start) << ": placement version "
                  << version << " on expert nodes "
                  << absl::StrJoin(resize.placement.worker_nodes, ",");
      });
}

void LoadBalancer::PushBias() {
  if (absl::Status gathered = Gather(nullptr); !gathered.ok()) {
    LOG_EVERY_N(WARNING, 10) << "online bias: gathering expert load: " << gathered;
    return;
  }
  absl::StatusOr<pb::ClusterState> state =
      control_->ClusterStateSnapshot(absl::Now() + options_.rpc_timeout);
  if (!state.ok()) return;
  if (k3::PushBias(LastReport(), AliveMembers(*state, pb::ROLE_ROUTER), options_.rpc_timeout,
                   calls_, metrics_->bias_pushes) == 0) {
    return;
  }
  // The routers restart their windows under the new bias; histograms of two biases never merge.
  window_.Reset(absl::Now());
}

}  // namespace k3
