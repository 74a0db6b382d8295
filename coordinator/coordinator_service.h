// CoordinatorService: the gRPC face of CoordinatorState (service k3serve.cluster.v1.Coordinator).
//
// The state lives on one Actor: every RPC becomes a closure on its mailbox and answers from there,
// so no handler blocks a gRPC thread and the state needs no lock. A timer on the same actor ticks
// the state twice per heartbeat interval (dead-member detection, placement repair) and refreshes
// the metrics:
//   k3_coordinator_members{role,state}     gauge
//   k3_coordinator_placement_version       gauge
//   k3_coordinator_ready                   gauge, 1 when the cluster is ready
//   k3_coordinator_rpcs_total{method,code} counter
// With routed experts, a LoadBalancer (coordinator/coordinator_balancer.h) gathers the routers' expert
// load, answers GetLoadReport and Rebalance, and rebalances or pushes the bias if configured.
//
// Thread-safety: RPCs and ClusterStateSnapshot may come from any thread. Shut the gRPC server down
// before destroying the service.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_SERVICE_H_
#define K3SERVE_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/actor.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_balancer.h"
#include "cluster/metrics.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {

class CoordinatorService final : public PlacementControl {
 public:
  // REQUIRES: options.Validate().ok(), balancing.Validate().ok(); `metrics` is not null and
  // outlives the service.
  CoordinatorService(const CoordinatorOptions& options, MetricsRegistry* metrics,
                     const LoadBalancerOptions& balancing = LoadBalancerOptions());
  ~CoordinatorService() override;

  // The gRPC service k3serve.cluster.v1.Coordinator, answering from this object; owned by it.
  grpc::Service* grpc_service();

  // The state as GetClusterState answers it; DEADLINE_EXCEEDED if the actor is stuck.
  absl::StatusOr<k3serve::cluster::v1::ClusterState> ClusterStateSnapshot(
      absl::Time deadline) override;
  // Stops the LoadBalancer: RPCs it waits for are cancelled and its queued GetLoadReport and
  // Rebalance calls answered UNAVAILABLE, so a server shutdown does not wait for them. Idempotent.
  void StopBalancing();

  absl::StatusOr<int64_t> ReservePlacementVersion(int64_t base_version,
                                                  absl::Time deadline) override;
  absl::Status CommitPlacement(const ClusterPlacement& placement, int64_t base_version,
                               absl::Time deadline) override;
  absl::StatusOr<std::optional<CoordinatorState::Resize>> PlanResize(
      absl::Time deadline) override;
  void ResizeFailed(int64_t base_version, const absl::Status& status) override;

 private:
  class Rpcs;  // the gRPC handlers (coordinator_service.cc)

  void ScheduleTick();
  void PublishMetrics();  // on the actor

  const absl::Duration tick_interval_;
  CoordinatorState state_;  // actor-confined
  MetricFamily<Gauge>& members_gauge_;
  Gauge* const placement_version_gauge_;
  Gauge* const ready_gauge_;
  MetricFamily<Counter>& rpcs_;
  Actor actor_;  // it stops (in the destructor) before the state goes away
  // Null for a dense model. Stopped first in the destructor: it calls into the actor.
  std::unique_ptr<LoadBalancer> balancer_;
  std::unique_ptr<Rpcs> grpc_service_;
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_SERVICE_H_
