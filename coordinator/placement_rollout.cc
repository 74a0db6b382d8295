#include "coordinator/placement_rollout.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

// How often the routers' reported versions (their heartbeats, in the cluster state) are looked at
// while a switch is awaited; the routers send a heartbeat as soon as they switch.
constexpr absl::Duration kSwitchPoll = absl::Milliseconds(20);
constexpr int kRetireAttempts = 10;

// While a rollout loads, how often it looks whether a worker node it waits for died.
constexpr absl::Duration kLoadingCheck = absl::Milliseconds(200);

// LoadExperts(requests[i]) on workers[i], all at once; `done` gets the answers on a gRPC thread.
// Returns the fan-out's canceller.
std::function<void()> LoadAllThen(
    RpcFanOut& calls, const std::vector<std::string>& workers,
    std::vector<pb::LoadExpertsRequest> requests, absl::Duration timeout,
    std::function<void(std::vector<absl::StatusOr<pb::LoadExpertsResponse>>)> done) {
  // The requests live with the calls (in what `start` returns), not on a stack.
  auto held = std::make_shared<std::vector<pb::LoadExpertsRequest>>(std::move(requests));
  return calls.CallAllThen<pb::LoadExpertsResponse>(
      workers, timeout,
      [held](const std::shared_ptr<grpc::Channel>& channel, size_t i,
             grpc::ClientContext* context, pb::LoadExpertsResponse* out,
             std::function<void(grpc::Status)> call_done) {
        std::shared_ptr<pb::ExpertWorker::Stub> stub = pb::ExpertWorker::NewStub(channel);
        stub->async()->LoadExperts(context, &(*held)[i], out, std::move(call_done));
        return std::shared_ptr<void>(
            std::make_shared<std::pair<std::shared_ptr<pb::ExpertWorker::Stub>,
                                       std::shared_ptr<std::vector<pb::LoadExpertsRequest>>>>(
                stub, held));
      },
      std::move(done));
}

}  // namespace

pb::LoadExpertsRequest LoadExpertsRequestFor(const ClusterPlacement& placement, int worker,
                                             int64_t retire_below, int64_t committed) {
  pb::LoadExpertsRequest request;
  request.set_placement_version(placement.version());
  request.set_worker(worker);
  request.set_retire_below_version(retire_below);
  request.set_committed_version(committed);
  for (int l = 0; l < placement.experts.num_layers(); ++l) {
    pb::LayerExperts* layer = request.add_experts();
    layer->set_layer(l);
    for (int e : placement.experts.ExpertsOn(worker, l)) layer->add_expert_ids(e);
  }
  return request;
}

void PlacementRollout::RollOut(const ClusterPlacement& next, int64_t base_version,
                               const pb::ClusterState& state, const std::string& what,
                               std::function<void(absl::Status)> done) {
  std::map<uint32_t, std::string> addresses;
  for (const pb::Member& m : state.members()) {
    addresses[m.node().node_id()] = m.node().grpc_address();
  }
  // 1. Every worker loads its experts of the new version (and keeps the old ones).
  std::vector<std::string> workers;
  std::vector<pb::LoadExpertsRequest> requests;
  for (int w = 0; w < next.experts.num_workers; ++w) {
    auto it = addresses.find(next.worker_nodes[w]);
    if (it == addresses.end()) {
      done(absl::AbortedError(absl::StrCat("rollout of ", what, ": worker node ",
                                           next.worker_nodes[w], " is not a member")));
      return;
    }
    workers.push_back(it->second);
    requests.push_back(LoadExpertsRequestFor(next, w, 0, base_version));
  }
  auto loading = std::make_shared<Loading>();
  auto shared_done = std::make_shared<std::function<void(absl::Status)>>(std::move(done));
  loading->cancel = LoadAllThen(
      *calls_, workers, std::move(requests), timeouts_.load_timeout,
      [this, loading, next, base_version, what, shared_done](
          std::vector<absl::StatusOr<pb::LoadExpertsResponse>> loaded) {
        const bool posted = actor_->Post([this, loading, next, base_version, what, shared_done,
                                          loaded = std::move(loaded)] {
          loading->finished = true;
          (*shared_done)(Loaded(next, base_version, what, loaded, loading->died));
        });
        if (!posted) (*shared_done)(absl::UnavailableError("the coordinator is stopping"));
      });
  actor_->PostAfter(kLoadingCheck, [this, loading, nodes = next.worker_nodes] {
    WatchLoading(loading, nodes);
  });
}

void PlacementRollout::WatchLoading(const std::shared_ptr<Loading>& loading,
                                    const std::vector<uint32_t>& nodes) {
  if (loading->finished || calls_->stopped()) return;
  absl::StatusOr<pb::ClusterState> state =
      control_->ClusterStateSnapshot(absl::Now() + timeouts_.rpc_timeout);
  if (state.ok()) {
    for (uint32_t node : nodes) {
      const auto member =
          std::find_if(state->members().begin(), state->members().end(),
                       [node](const pb::Member& m) { return m.node().node_id() == node; });
      if (member == state->members().end() || member->state() != pb::ALIVE) {
        // It will not answer (a hung node would hold the rollout for the whole load timeout):
        // give up now, so that the balancer plans again without it.
        loading->died = absl::StrCat("expert node ", node,
                                     " is no longer alive (dead or left) while loading its experts");
        loading->cancel();
        return;
      }
    }
  }
  actor_->PostAfter(kLoadingCheck, [this, loading, nodes] { WatchLoading(loading, nodes); });
}

absl::Status PlacementRollout::Loaded(
    const ClusterPlacement& next, int64_t base_version, const std::string& what,
    const std::vector<absl::StatusOr<pb::LoadExpertsResponse>>& loaded, const std::string& died) {
  if (!died.empty()) {
    return absl::AbortedError(absl::StrCat("rollout of ", what, " abandoned: ", died));
  }
  std::vector<std::string> failures;
  for (size_t w = 0; w < loaded.size(); ++w) {
    if (!loaded[w].ok()) {
      failures.push_back(absl::StrCat("expert node ", next.worker_nodes[w], " (worker ", w,
                                      "): ", loaded[w].status().message()));
    }
  }
  if (!failures.empty()) {
    return absl::UnavailableError(
        absl::StrCat("rollout of ", what, " abandoned: ", absl::StrJoin(failures, "; ")));
  }

  // 2. Publish: routers switch between steps.
  if (absl::Status committed =
          control_->CommitPlacement(next, base_version, absl::Now() + timeouts_.rpc_timeout);
      !committed.ok()) {
    return committed;
  }

  // 3. and 4. go on from the actor's timers: nothing waits on it.
  WatchSwitch(next.version(), absl::Now() + timeouts_.switch_timeout);
  return absl::OkStatus();
}

void PlacementRollout::WatchSwitch(int64_t version, absl::Time deadline) {
  if (calls_->stopped()) return;
  const bool switched = RoutersUse(version);
  if (!switched && absl::Now() < deadline) {
    actor_->PostAfter(kSwitchPoll, [this, version, deadline] { WatchSwitch(version, deadline); });
    return;
  }
  if (switched) {
    LOG(INFO) << "every router uses placement version " << version;
  } else {
    LOG(WARNING) << "not every router uses placement version " << version << " after "
                 << absl::FormatDuration(timeouts_.switch_timeout)
                 << "; the workers keep the old experts until they do";
  }
  actor_->PostAfter(timeouts_.retire_delay, [this] { Retire(kRetireAttempts); });
}

bool PlacementRollout::RoutersUse(int64_t version) {
  absl::StatusOr<pb::ClusterState> state =
      control_->ClusterStateSnapshot(absl::Now() + timeouts_.rpc_timeout);
  if (!state.ok()) return false;
  return std::all_of(state->members().begin(), state->members().end(),
                     [version](const pb::Member& m) {
                       return m.node().role() != pb::ROLE_ROUTER || m.state() != pb::ALIVE ||
                              m.applied_placement_version() >= version;
                     });
}

void PlacementRollout::Retire(int attempts_left) {
  if (calls_->stopped()) return;
  absl::StatusOr<pb::ClusterState> state =
      control_->ClusterStateSnapshot(absl::Now() + timeouts_.rpc_timeout);
  absl::StatusOr<ClusterPlacement> placement =
      state.ok() ? ClusterPlacementFromProto(state->placement()) : state.status();
  if (!placement.ok() || !placement->placed()) return;
  if (!RoutersUse(placement->version())) {
    if (attempts_left > 1) {
      actor_->PostAfter(timeouts_.retire_delay,
                        [this, attempts_left] { Retire(attempts_left - 1); });
    } else {
      LOG(WARNING) << "routers still use placements older than version " << placement->version()
                   << "; the expert nodes keep the old experts";
    }
    return;
  }
  std::map<uint32_t, std::string> addresses;
  for (const NodeAddress& n : AliveMembers(*state, pb::ROLE_EXPERT)) addresses[n.node] = n.address;
  std::vector<std::string> workers;
  std::vector<pb::LoadExpertsRequest> requests;
  for (int w = 0; w < placement->experts.num_workers; ++w) {
    auto it = addresses.find(placement->worker_nodes[w]);
    if (it == addresses.end()) continue;
    workers.push_back(it->second);
    requests.push_back(
        LoadExpertsRequestFor(*placement, w, placement->version(), placement->version()));
  }
  const int64_t version = placement->version();
  LoadAllThen(*calls_, workers, std::move(requests), timeouts_.load_timeout,
              [version](std::vector<absl::StatusOr<pb::LoadExpertsResponse>> retired) {
                for (const absl::StatusOr<pb::LoadExpertsResponse>& answer : retired) {
                  if (!answer.ok()) {
                    LOG(WARNING) << "retiring placements before version " << version << ": "
                                 << answer.status();
                  }
                }
              });
}

}  // namespace k3
