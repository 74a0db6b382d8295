// RouterCore: the router tier's data-plane loop. For each MoeRequest an attention worker sends:
//
//   PrepareRouterStep (scores, top-k, latent down projection, dispatch plan; the same math as the
//   single-process engine) -> one ExpertRequest per expert worker with rows -> collect their
//   ExpertResponses -> FinishRouterStep (sum of partials, routed_expert_norm) -> MoeResponse.
//
// Expert workers are the worker slots of the coordinator's placement; the node behind a slot is
// reached as PeerId = node id through PeerLinks. Steps from several attention workers and layers may
// be in flight at once (PendingSteps), each with a deadline.
//
// A worker node is lost when
//   - the transport reports the node failed (its process died),
//   - the coordinator marks it DEAD or it leaves,
//   - it does not answer within step_timeout (it then counts as lost until it answers anything;
//     rows with no other live host still go to it, since only its answer can clear the suspicion
//     and the coordinator, which sees its heartbeats, will not move its experts). A worker
//     answers for the time since its rows went out: a held step planned again gets a new
//     step_timeout from then.
// A MoE layer step is a pure function of its rows, so when the placement has replicas
// (coordinator/coordinator.h), a step also has an expert deadline far below step_timeout:
// max(expert_retry_floor, expert_retry_p99_factor x the p99 time from sending a step's
// ExpertRequests to its last answer, over the last steps answered without a resend). A worker that
// misses it (a hung process: no failure, no answer) is slow: the rows it owes go again, unchanged,
// to a live worker that holds every expert they name (or, when no one worker holds them all,
// split by expert over live hosts of each), and new steps send its experts' rows to live replicas
// only, until it answers anything. Rows without a live replica keep waiting for it until
// step_timeout; a slow node alone never fails a step.
// When a node is lost and the placement has replicas, every pending step waiting for it sends
// that node's request again, unchanged, to a live worker that holds every expert the request
// names (or split by expert over live hosts of each), and keeps waiting (a new step_timeout);
// later steps send each token's rows to live replicas only. A step whose rows need an expert with
// no live host (its last host died) is held, not failed: the coordinator hands the dead node's
// slot to a spare or moves its experts onto the survivors
// (coordinator/coordinator.h, "Elastic expert tier"), and with every new cluster state (and every
// 100 ms) held steps are planned again from their MoeRequest, under the placement then in force:
// the step resumes. It fails, with UNAVAILABLE naming the worker and the cause, as in "expert
// worker node 5 (pid 1234 on host-a) lost: <why>; the coordinator cannot move its experts: <why>",
// as soon as the cluster state says the experts cannot be moved (lost_experts_reason), or once
// it was held step_timeout. A node the coordinator listed as an unrecoverable loss
// (unrecoverable_losses: no spare, no room for its experts elsewhere) fails such steps at once.
// (A worker this router is not connected to yet is this router's problem: ABORTED, and the
// attention worker sends the layer to another router.) Readiness: every expert has a live host.
//
// Malformed requests, layers without routed experts and rows of the wrong width are answered with
// INVALID_ARGUMENT; a step before any placement with UNAVAILABLE.
//
// Metrics (when a registry is given): k3_router_steps_total{code}, k3_router_step_seconds,
// where an answered step's time went: k3_router_step_compute_seconds (gate, plan, encoding,
// combine) and k3_router_step_expert_wait_seconds (wire both ways plus expert compute; one
// observation each per step answered OK),
// k3_router_pending_steps, k3_router_routed_tokens_total{layer} and k3_router_expert_load_max_vio
// {layer} (MoE layer index; the window of GetLoadStats).
//
// Thread-safety: none; one thread makes every call (RouterNode's actor, "router"; the test's).
// Nothing in it locks.
#ifndef K3SERVE_ROUTER_ROUTER_CORE_H_
#define K3SERVE_ROUTER_ROUTER_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "moe/cluster_placement.h"
#include "moe/moe_wire.h"
#include "cluster/metrics.h"
#include "cluster/retry_deadline.h"
#include "cluster/span_log.h"
#include "cluster/transport.h"
#include "model/weights.h"
#include "proto/cluster.pb.h"
#include "router/pending_steps.h"
#include "cluster/peer_links.h"
#include "router/router_load_stats.h"
#include "router/router_metrics.h"

namespace k3 {

struct RouterCoreOptions {
  // The expert deadline (see the file comment): max(floor, factor x p99). The floor keeps noise
  // on a loaded machine from causing resends; an early resend costs only duplicate work.
  absl::Duration expert_retry_floor = absl::Milliseconds(300);
  double expert_retry_p99_factor = 8;
  absl::Duration step_timeout = absl::Seconds(5);
  int qb_bins = 100;  // QB histogram bins per expert (router/router_load_stats.h); 0: none
  // Exports k3_router_expert_routed_tokens_total{expert}: one series per expert id (summed over
  // layers, so at most num_experts series, 896 for K3). Off by default: most scrapers do not
  // want that many.
  bool per_expert_metrics = false;
  // Where the spans of traced layer steps go ("k3.router.layer", under the attention worker's
  // step span; not owned, outlives the core). Null: none.
  SpanLog* spans = nullptr;
};

class RouterCore {
 public:
  // `weights` needs the router tensors of every MoE layer (WeightSelection::RouterOnly()).
  // `weights`, `transport`, `links` and `metrics` (may be null) must outlive the core.
  // INVALID_ARGUMENT for a model without routed experts or bad options.
  static absl::StatusOr<std::unique_ptr<RouterCore>> Create(const ModelWeights* weights,
                                                            Transport* transport,
                                                            PeerLinks* links,
                                                            const RouterCoreOptions& options,
                                                            MetricsRegistry* metrics);
  ~RouterCore();
  RouterCore(const RouterCore&) = delete;
  RouterCore& operator=(const RouterCore&) = delete;

  // Applies the coordinator's newest cluster state (members and placement) at once: steps
  // waiting for dead nodes end, held steps are planned again under it.
  void UpdateClusterState(const k3serve::cluster::v1::ClusterState& state);

  // Handles what arrives until `deadline` (at most one message) and ends the steps whose
  // deadline passed. Returns CANCELLED once the transport is closed.
  absl::Status Poll(absl::Time deadline);

  // Answers every pending step with `status` (shutdown).
  void FailAll(const absl::Status& status);

  // OK once a placement is in force and every worker slot has a live, connected node; else why not.
  absl::Status Readiness() const;

  // Tokens per expert and QB statistics per MoE layer (see router_load_stats.h).
  k3serve::cluster::v1::LoadStatsResponse LoadStats(bool reset);

  // The placement version new steps are planned with (0: none).
  int64_t placement_version() const;

  // Online bias (the coordinator's QB estimate; CHANGES THE MODEL'S OUTPUTS): MoE layer
  // `moe_layer` routes with `bias` instead of the checkpoint's e_score_correction_bias from the
  // next step; steps already routed are not touched. Its load window starts
  // anew. INVALID_ARGUMENT for a layer out of range or not one finite value per expert.
  absl::Status SetBias(int moe_layer, std::vector<float> bias);

 private:
  struct Suspect {
    uint64_t incarnation = 0;
    std::string reason;
  };

  RouterCore(const ModelWeights* weights, Transport* transport, PeerLinks* links,
             const RouterCoreOptions& options, std::unique_ptr<RouterLoadStats> stats,
             MetricsRegistry* metrics);

  void ApplyClusterState(const k3serve::cluster::v1::ClusterState& state);
  // `start`: when the request first arrived; `held`: a held request planned again.
  void HandleMoeRequest(PeerId from, MessageBytes bytes, absl::Time start, bool held = false);
  // Why a decoded request cannot be planned (layer, width, no placement); OK when it can.
  absl::Status CheckMoeRequest(const MoeRequest& request) const;
  // A new step of `request`: gate, top-k and dispatch plan over the live hosts of each expert.
  std::unique_ptr<PendingStep> PlanStep(PeerId from, const MoeRequest& request, const float* rows,
                                        absl::Time start, bool held);
  // Sends each worker its rows (the step's request holds the layer's rows at `rows_at`). On
  // UNAVAILABLE, `*lost` is the node whose rows found no taker and the step must be held.
  absl::Status Dispatch(PendingStep& step, size_t rows_at, PeerId* lost);
  // The load statistics and metrics of a step that went out.
  void RecordRouted(const PendingStep& step);
  // Holds a request whose rows need an expert without a live host (see the file comment), or
  // fails it when the coordinator says the experts cannot move or it waited step_timeout.
  void HoldOrFail(PeerId origin, uint64_t origin_step, absl::Time start, MessageBytes request,
                  PeerId node, const absl::Status& why);
  // Plans the held requests again (all: a new cluster state) or fails those held too long.
  void RetryHeld();
  void ExpireHeld(absl::Time now);
  void HandleExpertResponse(PeerId from, MessageBytes bytes);
  void ExpireSteps(absl::Time now);
  void Finish(std::unique_ptr<PendingStep> step);
  // Answers a dispatched step with an error (recording its spans).
  void Fail(const PendingStep& step, const absl::Status& status);
  // Answers a request that was held and never dispatched (`request`: the encoded MoeRequest) with
  // an error, recording its spans as a step that waited for experts all along.
  void FailHeld(PeerId origin, uint64_t origin_step, absl::Time start, std::string_view request,
                const absl::Status& status);
  // The step's spans, one per trace context it carries (RouterCoreOptions::spans).
  void RecordSpans(const PendingStep& step, absl::Time end, absl::Duration compute,
                   absl::Duration expert_wait, bool ok);
  // Sends every pending step waiting for `node` to replicas (SendToReplicas), or fails it.
  void FailWaitingOn(PeerId node, const absl::Status& status);
  // Sends the requests `step` sent to `node` and still waits for again, each to a live worker
  // holding all of its experts. False (step unchanged or partly resent) when one has none.
  bool SendToReplicas(PendingStep& step, PeerId node);
  // Replaces slot `slot` of `step` (owed by a lost or slow node) by one new slot per live worker
  // that takes some of its experts' rows (the first host of each expert that `usable` accepts),
  // and sends them. False when an expert has no usable host (step unchanged) or a send failed.
  bool SplitToReplicas(PendingStep& step, size_t slot, int moe_layer,
                       const std::function<bool(int)>& usable);
  // `node` missed a step's expert deadline: every pending step's rows it owes go to replicas
  // where one holds all their experts (SendToReplicas); the rest keep waiting for it.
  void ResendWaitingOnSlow(PeerId node);
  // The deadline of a step whose requests went out at `now`.
  absl::Time StepDeadline(absl::Time now, absl::Time timeout_at) const;
  // Answers a step that has no rows to return: an error, or a step of no tokens.
  void Reply(PeerId origin, uint64_t origin_step, absl::Time start, absl::Status status);
  // Sends an encoded MoeResponse whose status has `code`, counting it in the metrics.
  void SendAnswer(PeerId origin, uint64_t origin_step, absl::Time start, absl::StatusCode code,
                  std::string message);
  // OK when worker slot `worker` of the placement can take rows now; else UNAVAILABLE naming it.
  absl::Status WorkerStatus(int worker) const;
  // True when `node`'s only fault is a missed step timeout (suspects_): it is a member, not DEAD
  // or LEFT, and its link is up.
  bool OnlySuspected(PeerId node) const;
  // UNAVAILABLE for `node` when it is lost or unreachable; OK otherwise.
  absl::Status NodeStatus(PeerId node) const;
  std::string WorkerName(PeerId node) const;
  void UpdateReadiness();

  const ModelWeights* const weights_;
  const ModelConfig& config_;
  Transport* const transport_;
  PeerLinks* const links_;
  const RouterCoreOptions options_;
  const std::unique_ptr<RouterLoadStats> stats_;
  std::unique_ptr<RouterMetrics> metrics_;  // null without a registry

  // The router weights of each model layer (empty for layers without routed experts): views of
  // `weights_`, but the bias may be replaced by SetBias.
  std::vector<RouterWeights> routers_;

  ClusterPlacement placement_;
  std::string placement_problem_;  // why no placement is in force; empty when one is
  std::map<uint32_t, k3serve::cluster::v1::Member> members_;
  std::map<PeerId, Suspect> suspects_;  // timed out, by node
  std::string holding_for_;  // why held_ was last logged (empty: not holding)
  std::set<PeerId> slow_;               // missed an expert deadline, no answer since
  RetryDeadline expert_deadline_;  // from the steps' expert round trips
  PendingSteps pending_;
  struct Held {
    PeerId origin = 0;
    uint64_t origin_step = 0;
    absl::Time start;
    MessageBytes request;  // the encoded MoeRequest
    PeerId node = 0;      // the lost worker
    absl::Status why;     // why, for the error if it is never planned
  };
  std::vector<Held> held_;
  absl::Time next_held_retry_ = absl::InfinitePast();
  std::string lost_experts_reason_;  // the cluster state's
  std::map<uint32_t, std::string> unrecoverable_losses_;  // the cluster state's
  uint64_t next_step_id_ = 1;
  bool has_replicas_ = false;  // some expert of the placement has several hosts

  absl::Status readiness_ = absl::UnavailableError("no cluster state yet");
};

}  // namespace k3

#endif  // K3SERVE_ROUTER_ROUTER_CORE_H_
