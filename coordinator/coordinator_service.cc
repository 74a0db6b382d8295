#include "coordinator/coordinator_service.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "base/status_macros.h"
#include "cluster/actor_rpc.h"
#include "cluster/grpc_status.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

// The gRPC handlers: an RPC on the state runs on the service's actor (OnActor); GetLoadReport and
// Rebalance go to its LoadBalancer, which answers them from its own actor.
class CoordinatorService::Rpcs final : public pb::Coordinator::CallbackService {
 public:
  explicit Rpcs(CoordinatorService* service) : service_(*service) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const pb::RegisterRequest* request,
                                     pb::RegisterResponse* response) override {
    return OnActor(context, "Register", [this, request, response] {
      K3_ASSIGN_OR_RETURN(pb::RegisterResponse result,
                          service_.state_.Register(*request, absl::Now()));
      *response = std::move(result);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const pb::HeartbeatRequest* request,
                                      pb::HeartbeatResponse* response) override {
    return OnActor(context, "Heartbeat", [this, request, response] {
      const HeartbeatReply reply =
          service_.state_.Heartbeat(request->node_id(), request->incarnation(), request->load(),
                                    absl::Now(), request->applied_placement_version(),
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

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const pb::LeaveRequest* request, pb::LeaveResponse*) override {
    return OnActor(context, "Leave", [this, request] {
      return service_.state_.Leave(request->node_id(), request->incarnation(), absl::Now());
    });
  }

  grpc::ServerUnaryReactor* GetClusterState(grpc::CallbackServerContext* context,
                                            const pb::GetClusterStateRequest*,
                                            pb::ClusterState* response) override {
    return OnActor(context, "GetClusterState", [this, response] {
      *response = service_.state_.State();
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const pb::DrainRequest* request, pb::DrainResponse*) override {
    return OnActor(context, "Drain", [this, request] {
      return service_.state_.Drain(request->node_id(), absl::Now());
    });
  }

  grpc::ServerUnaryReactor* GetLoadReport(grpc::CallbackServerContext* context,
                                          const pb::GetLoadReportRequest* request,
                                          pb::LoadReport* response) override {
    return OnBalancer(context, "GetLoadReport", response, [&](auto done) {
      service_.balancer_->GetLoadReport(request->refresh(), std::move(done));
    });
  }

  grpc::ServerUnaryReactor* Rebalance(grpc::CallbackServerContext* context,
                                      const pb::RebalanceRequest* request,
                                      pb::RebalanceResponse* response) override {
    return OnBalancer(context, "Rebalance", response, [&](auto done) {
      service_.balancer_->Rebalance(request->force(), std::move(done));
    });
  }

 private:
  // Runs fn on the service's actor (RunOnActor: no gRPC thread waits), counts the call in
  // k3_coordinator_rpcs_total and finishes it with fn's status.
  grpc::ServerUnaryReactor* OnActor(grpc::CallbackServerContext* context, const char* method,
                                    std::function<absl::Status()> fn) {
    return RunOnActor(service_.actor_, context, [this, method, fn = std::move(fn)] {
      const absl::Status status = fn();
      service_.rpcs_.WithLabels({method, absl::StatusCodeToString(status.code())})->Increment();
      service_.PublishMetrics();
      return status;
    });
  }

  // An RPC the LoadBalancer answers: FAILED_PRECONDITION for a model without routed experts;
  // otherwise start(done) hands the balancer `done`, which fills `response` with its outcome,
  // counts the call in k3_coordinator_rpcs_total and finishes it.
  template <typename Response, typename Start>
  grpc::ServerUnaryReactor* OnBalancer(grpc::CallbackServerContext* context, const char* method,
                                       Response* response, const Start& start) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (service_.balancer_ == nullptr) {
      reactor->Finish(grpc::Status(grpc::FAILED_PRECONDITION, "the model has no routed experts"));
      return reactor;
    }
    start([this, method, reactor, response](absl::StatusOr<Response> outcome) {
      if (outcome.ok()) *response = *std::move(outcome);
      service_.rpcs_.WithLabels({method, absl::StatusCodeToString(outcome.status().code())})
          ->Increment();
      reactor->Finish(ToGrpcStatus(outcome.status()));
    });
    return reactor;
  }

  CoordinatorService& service_;
};

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
      actor_("coordinator"),
      grpc_service_(std::make_unique<Rpcs>(this)) {
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

grpc::Service* CoordinatorService::grpc_service() { return grpc_service_.get(); }

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
