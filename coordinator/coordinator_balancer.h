// LoadBalancer: the coordinator's expert-load loop. It gathers the routers' load windows, merges
// them (coordinator/coordinator_load.h), and optionally acts on them:
//
//  - Gathering: every `gather_interval` (and before every decision) it calls
//    RouterControl.GetLoadStats(reset) on every ALIVE router, all at once, each with a deadline.
//    The merged window yields the LoadReport (GetLoadReport RPC) and these metrics:
//      k3_coordinator_expert_load_max_vio{layer}  (max - mean) / mean tokens per expert
//      k3_coordinator_worker_load_max_vio{layer}  the same over workers, current placement
//      k3_coordinator_window_tokens               tokens in the window, summed over layers
//      k3_coordinator_load_gathers_total{code}    GetLoadStats calls by status
//      k3_coordinator_rebalances_total{outcome}   rolled_out, unchanged, failed
//      k3_coordinator_bias_pushes_total{code}     SetBias calls by status
//    Per-expert numbers stay out of the metrics (layers x experts series); GetLoadReport has them.
//
//  - Rebalancing (every `rebalance_interval`, or on a Rebalance RPC): plans a placement from the
//    window's per-expert loads (coordinator/expert_placement_planner.h) with each worker's share of
//    the experts plus `spare_slots_per_worker` slots, and rolls it out when it lowers the mean
//    worker MaxVio by `min_improvement` of its value (always, if forced and different): it
//    reserves the next placement version and rolls it out (coordinator/placement_rollout.h: load
//    on every worker, publish, wait for the routers, retire the old experts). The window restarts
//    after every rollout. Placement moves no math: tokens do not change (up to fp32 summation
//    order across workers).
//
//  - Resizing (every `resize_interval`): the elastic expert tier (coordinator/coordinator.h). When
//    CoordinatorState::PlanResize has a new worker set due (a node joins, a worker drains, or a
//    dead worker was the last host of experts), it is rolled out as above: reserve, LoadExperts
//    on every worker of the new set (the joiners map their experts; the others keep what older
//    versions use), commit, wait for the routers, retire. A failed LoadExperts abandons it and
//    is reported (CoordinatorState::ResizeFailed); it is tried again after `resize_retry`.
//      k3_coordinator_resizes_total{outcome}     rolled_out, failed
//
//  - Online bias (every `online_bias_interval`; off by default). CHANGES THE MODEL'S OUTPUTS:
//    gathers, pushes each layer's centred QB estimate (spec §8) as the routers' new
//    e_score_correction_bias (coordinator/online_bias.h), then restarts the window.
//
// Everything runs on one thread of the balancer's own; the RPC-facing methods hand work to it.
// Thread-safety: all public methods may be called from any thread.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_BALANCER_H_
#define K3SERVE_COORDINATOR_COORDINATOR_BALANCER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/actor.h"
#include "cluster/metrics.h"
#include "cluster/security.h"
#include "coordinator/coordinator_load.h"
#include "coordinator/placement_control.h"
#include "coordinator/placement_rollout.h"
#include "coordinator/rpc_fan_out.h"
#include "moe/cluster_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct LoadBalancerOptions {
  absl::Duration gather_interval = absl::Seconds(5);         // zero: gather only when needed
  absl::Duration rebalance_interval = absl::ZeroDuration();  // zero: no periodic rebalancing
  int spare_slots_per_worker = 0;  // experts per layer a worker may hold beyond its share
  double min_improvement = 0.1;    // relative drop of the mean worker MaxVio that is worth it
  absl::Duration online_bias_interval = absl::ZeroDuration();  // zero: off (the default)
  absl::Duration rpc_timeout = absl::Seconds(2);               // GetLoadStats, SetBias, retirement
  absl::Duration load_timeout = absl::Seconds(60);             // LoadExperts of a rollout
  absl::Duration switch_timeout = absl::Seconds(10);           // routers taking up a new placement
  absl::Duration retire_delay = absl::Seconds(5);              // then, before old experts may go
  absl::Duration resize_interval = absl::Milliseconds(100);    // zero: the worker set never changes
  absl::Duration resize_retry = absl::Seconds(1);              // after a failed resize
  ClientTls tls;  // how the balancer dials routers and expert workers (plaintext by default)

  // INVALID_ARGUMENT naming the field for negative durations or counts, non-positive timeouts,
  // or min_improvement outside [0, 1).
  absl::Status Validate() const;
};

class LoadBalancer {
 public:
  // REQUIRES: options.Validate().ok(), num_layers >= 1, num_experts >= 1. `control` and
  // `metrics` must outlive the balancer.
  LoadBalancer(const LoadBalancerOptions& options, int num_layers, int num_experts,
               PlacementControl* control, MetricsRegistry* metrics);
  // Stop().
  ~LoadBalancer();
  LoadBalancer(const LoadBalancer&) = delete;
  LoadBalancer& operator=(const LoadBalancer&) = delete;

  // The report of the last gathering round, or (refresh) of a new one. `done` runs once, on the
  // balancer's thread or (no refresh, or stopped) the caller's; UNAVAILABLE after Stop.
  void GetLoadReport(bool refresh,
                     std::function<void(absl::StatusOr<k3serve::cluster::v1::LoadReport>)> done);

  // Gathers, plans and, if worth it (or `force`d and different), rolls a placement out; `done`
  // gets the outcome once the routers switched (or the rollout gave up). Errors as documented for
  // the Rebalance RPC in proto/cluster.proto.
  void Rebalance(bool force,
                 std::function<void(absl::StatusOr<k3serve::cluster::v1::RebalanceResponse>)> done);

  // Cancels the RPCs in flight, answers queued requests with UNAVAILABLE and joins the thread.
  // Idempotent.
  void Stop();

 private:
  struct Metrics;

  // All on the balancer's thread.
  // Runs `work` on the actor every `interval` (never when it is zero) until Stop.
  void SchedulePeriodic(absl::Duration interval, std::function<void()> work);
  // Gathering, rebalancing, online bias and resizing at their configured intervals.
  void SchedulePeriodicWork();
  // Rolls out the worker-set change PlanResize asks for, if any.
  void Resize();
  // GetLoadStats on every alive router into the window; refreshes the report and the metrics.
  // The cluster state it used goes to *state when not null.
  absl::Status Gather(k3serve::cluster::v1::ClusterState* state);
  void PublishReport(const ClusterPlacement& placement, int answered, int failed);
  k3serve::cluster::v1::LoadReport LastReport() const;
  using RebalanceDone =
      std::function<void(absl::StatusOr<k3serve::cluster::v1::RebalanceResponse>)>;
  // A placement to roll out, as planned.
  struct Rollout {
    ClusterPlacement next;  // not placed(): nothing to roll out
    int64_t base_version = 0;
    k3serve::cluster::v1::ClusterState state;
  };
  // Plans and rolls out; `done` gets the outcome on the actor once the rollout committed or gave
  // up (at once when there is nothing to roll out, or while another rollout runs: ABORTED).
  void DoRebalance(bool force, RebalanceDone done);
  // Gathers and plans; the placement to roll out, if any, goes to *rollout.
  absl::StatusOr<k3serve::cluster::v1::RebalanceResponse> PlanRebalance(bool force,
                                                                       Rollout* rollout);
  void PushBias();

  const LoadBalancerOptions options_;
  PlacementControl* const control_;
  std::unique_ptr<Metrics> metrics_;
  RpcFanOut calls_;  // stopped first, in Stop: the coordinator is stopping

  // Balancer thread only.
  LoadWindow window_;
  PlacementRollout rollout_;
  int64_t rebalances_ = 0;
  absl::Time resize_after_ = absl::InfinitePast();  // no resize before (after a failure)
  // A rollout (rebalance or resize) runs: its LoadExperts are in flight. One at a time.
  bool rolling_out_ = false;

  mutable absl::Mutex mu_;
  k3serve::cluster::v1::LoadReport report_ ABSL_GUARDED_BY(mu_);

  Actor actor_;  // last: stops (in Stop) before the rest goes away
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_BALANCER_H_
