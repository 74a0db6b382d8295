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

// LoadExperts(requests[i]) on workers[i], all at once.
std::vector<absl::StatusOr<pb::LoadExpertsResponse>> LoadAll(
    RpcFanOut& calls, const std::vector<std::string>& workers,
    const std::vector<pb::LoadExpertsRequest>& requests, absl::Duration timeout) {
  return calls.CallAll<pb::LoadExpertsResponse>(
      workers, timeout,
      [&requests](const std::shared_ptr<grpc::Channel>& channel, size_t i,
                  grpc::ClientContext* context, pb::LoadExpertsResponse* out,
                  std::function<void(grpc::Status)> done) {
        std::shared_ptr<pb::ExpertWorker::Stub> stub = pb::ExpertWorker::NewStub(channel);
        stub->async()->LoadExperts(context, &requests[i], out, std::move(done));
        return std::shared_ptr<void>(stub);
      });
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

absl::Status PlacementRollout::RollOut(const ClusterPlacement& next, int64_t base_version,
                                       const pb::ClusterState& state, const std::string& what) {
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
      return absl::AbortedError(absl::StrCat("rollout of ", what, ": worker node ",
                                             next.worker_nodes[w], " is not a member"));
    }
    workers.push_back(it->second);
    requests.push_back(LoadExpertsRequestFor(next, w, 0, base_version));
  }
  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> loaded =
      LoadAll(*calls_, workers, requests, timeouts_.load_timeout);
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
  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> retired =
      LoadAll(*calls_, workers, requests, timeouts_.load_timeout);
  for (const absl::StatusOr<pb::LoadExpertsResponse>& answer : retired) {
    if (!answer.ok()) {
      LOG(WARNING) << "retiring placements before version " << placement->version() << ": "
                   << answer.status();
    }
  }
}

}  // namespace k3
