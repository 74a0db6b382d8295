#include "coordinator/coordinator_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "base/status_macros.h"
#include "cluster/actor_rpc.h"
#include "cluster/grpc_status.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

CoordinatorService::CoordinatorService(const CoordinatorOptions& options,
                                       MetricsRegistry* metrics,
                                       const LoadBalancerOptions& balancing)
    : tick_interval_(options.heartbeat_interval / 2),
      state_(options, absl::Now()),
      members_gauge_(metrics->AddGauge("k3_coordinator_members",
                                       "Cluster members known to the coordinator.",
                                       {"role", "state"})),
      placement_version_gauge_(
          metrics
              ->AddGauge("k3_coordinator_placement_version",
                         "Version of the current expert placement (0: none yet).")
              .Get()),
      ready_gauge_(
          metrics->AddGauge("k3_coordinator_ready", "1 when the cluster is ready to serve.")
              .Get()),
      rpcs_(metrics->AddCounter("k3_coordinator_rpcs_total", "Coordinator RPCs answered.",
                                {"method", "code"})),
      actor_("coordinator") {
  actor_.Post([this] { PublishMetrics(); });
  ScheduleTick();
  if (options.num_experts > 0) {
    balancer_ = std::make_unique<LoadBalancer>(balancing, options.num_moe_layers,
                                               options.num_experts, this, metrics);
  }
}

CoordinatorService::~CoordinatorService() {
  StopBalancing();
  actor_.Stop();
}

void CoordinatorService::StopBalancing() {
  if (balancer_ != nullptr) balancer_->Stop();
}

absl::StatusOr<pb::ClusterState> CoordinatorService::ClusterStateSnapshot(absl::Time deadline) {
  return actor_.Call([this] { return state_.State(); }, deadline);
}

absl::StatusOr<int64_t> CoordinatorService::ReservePlacementVersion(int64_t base_version,
                                                                    absl::Time deadline) {
  return actor_.Call([this, base_version] { return state_.ReservePlacementVersion(base_version); },
                     deadline);
}

absl::Status CoordinatorService::CommitPlacement(const ClusterPlacement& placement,
                                                 int64_t base_version, absl::Time deadline) {
  return actor_.Call(
      [this, placement, base_version] {
        absl::Status status = state_.CommitPlacement(placement, base_version, absl::Now());
        PublishMetrics();
        return status;
      },
      deadline);
}

absl::StatusOr<std::optional<CoordinatorState::Resize>> CoordinatorService::PlanResize(
    absl::Time deadline) {
  return actor_.Call([this] { return state_.PlanResize(absl::Now()); }, deadline);
}

void CoordinatorService::ResizeFailed(int64_t base_version, const absl::Status& status) {
  actor_.Post([this, base_version, status] {
    state_.ResizeFailed(base_version, status, absl::Now());
    PublishMetrics();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::OnActor(grpc::CallbackServerContext* context,
                                                      const char* method,
                                                      std::function<absl::Status()> fn) {
  return RunOnActor(actor_, context, [this, method, fn = std::move(fn)] {
    const absl::Status status = fn();
    rpcs_.WithLabels({method, absl::StatusCodeToString(status.code())})->Increment();
    PublishMetrics();
    return status;
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* context,
                                                       const pb::RegisterRequest* request,
                                                       pb::RegisterResponse* response) {
  return OnActor(context, "Register", [this, request, response] {
    K3_ASSIGN_OR_RETURN(pb::RegisterResponse result, state_.Register(*request, absl::Now()));
    *response = std::move(result);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const pb::HeartbeatRequest* request,
                                                        pb::HeartbeatResponse* response) {
  return OnActor(context, "Heartbeat", [this, request, response] {
    const HeartbeatReply reply =
        state_.Heartbeat(request->node_id(), request->incarnation(), request->load(), absl::Now(),
                         request->applied_placement_version(),
                         std::vector<uint64_t>(request->broken_device_channels().begin(),
                                               request->broken_device_channels().end()));
    response->set_unknown_node(reply.unknown_node);
    response->set_placement_version(reply.placement_version);
    response->set_members_version(reply.members_version);
    response->set_drain(reply.drain);
    response->set_cluster_ready(reply.cluster_ready);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* context,
                                                    const pb::LeaveRequest* request,
                                                    pb::LeaveResponse*) {
  return OnActor(context, "Leave", [this, request] {
    return state_.Leave(request->node_id(), request->incarnation(), absl::Now());
  });
}

grpc::ServerUnaryReactor* CoordinatorService::GetClusterState(
    grpc::CallbackServerContext* context, const pb::GetClusterStateRequest*,
    pb::ClusterState* response) {
  return OnActor(context, "GetClusterState", [this, response] {
    *response = state_.State();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Drain(grpc::CallbackServerContext* context,
                                                    const pb::DrainRequest* request,
                                                    pb::DrainResponse*) {
  return OnActor(context, "Drain",
                 [this, request] { return state_.Drain(request->node_id(), absl::Now()); });
}

grpc::ServerUnaryReactor* CoordinatorService::GetLoadReport(
    grpc::CallbackServerContext* context, const pb::GetLoadReportRequest* request,
    pb::LoadReport* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (balancer_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::FAILED_PRECONDITION, "the model has no routed experts"));
    return reactor;
  }
  balancer_->GetLoadReport(request->refresh(),
                           [this, reactor, response](absl::StatusOr<pb::LoadReport> report) {
                             if (report.ok()) *response = *std::move(report);
                             rpcs_.WithLabels({"GetLoadReport",
                                               absl::StatusCodeToString(report.status().code())})
                                 ->Increment();
                             reactor->Finish(ToGrpcStatus(report.status()));
                           });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Rebalance(grpc::CallbackServerContext* context,
                                                        const pb::RebalanceRequest* request,
                                                        pb::RebalanceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (balancer_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::FAILED_PRECONDITION, "the model has no routed experts"));
    return reactor;
  }
  balancer_->Rebalance(request->force(), [this, reactor,
                                          response](absl::StatusOr<pb::RebalanceResponse> outcome) {
    if (outcome.ok()) *response = *std::move(outcome);
    rpcs_.WithLabels({"Rebalance", absl::StatusCodeToString(outcome.status().code())})
        ->Increment();
    reactor->Finish(ToGrpcStatus(outcome.status()));
  });
  return reactor;
}

void CoordinatorService::ScheduleTick() {
  actor_.PostAfter(tick_interval_, [this] {
    state_.Tick(absl::Now());
    PublishMetrics();
    ScheduleTick();
  });
}

void CoordinatorService::PublishMetrics() {
  const auto counts = state_.CountMembers();
  for (pb::Role role : {pb::ROLE_ATTENTION, pb::ROLE_ROUTER, pb::ROLE_EXPERT}) {
    for (pb::MemberState st : {pb::ALIVE, pb::DEAD, pb::LEFT}) {
      auto it = counts.find({role, st});
      members_gauge_
          .WithLabels({absl::AsciiStrToLower(pb::Role_Name(role).substr(5)),
                       absl::AsciiStrToLower(pb::MemberState_Name(st))})
          ->Set(it == counts.end() ? 0 : it->second);
    }
  }
  placement_version_gauge_->Set(static_cast<double>(state_.placement().version()));
  ready_gauge_->Set(state_.ready() ? 1 : 0);
}

}  // namespace k3
