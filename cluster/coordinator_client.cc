#include "cluster/coordinator_client.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

#include "cluster/grpc_status.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(50);

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t value = 0;
  while (value == 0) value = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return value;
}

}  // namespace

class CoordinatorClient::Rpc {
 public:
  Rpc(const std::string& address, const ClientTls& tls) {
    grpc::ChannelArguments args;
    // gRPC's default reconnect backoff grows to two minutes; a restarted coordinator must be
    // found again within a heartbeat or two.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = pb::Coordinator::NewStub(tls.Connect(address, args));
  }

  // Calls stub method `call` with a deadline of `timeout`.
  template <typename Request, typename Response, typename Method>
  absl::Status Call(Method call, const Request& request, Response* response,
                    absl::Duration timeout) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return FromGrpcStatus((stub_.get()->*call)(&context, request, response));
  }

 private:
  std::unique_ptr<pb::Coordinator::Stub> stub_;
};

CoordinatorClient::CoordinatorClient(CoordinatorClientOptions options,
                                     CoordinatorCallbacks callbacks)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      incarnation_(options_.node.incarnation() != 0 ? options_.node.incarnation()
                                                    : RandomIncarnation()),
      rpc_(std::make_unique<Rpc>(options_.coordinator_address, options_.tls)) {
  {
    absl::MutexLock lock(&mu_);
    node_id_ = options_.node.node_id();
  }
}

void CoordinatorClient::Start() {
  CHECK(!thread_.joinable()) << "CoordinatorClient::Start called twice";
  thread_ = std::thread([this] { Loop(); });
}

CoordinatorClient::~CoordinatorClient() { Stop(); }

absl::StatusOr<uint32_t> CoordinatorClient::WaitRegistered(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&registered_), deadline)) {
    return absl::DeadlineExceededError("not registered with the coordinator at " +
                                       options_.coordinator_address + " yet");
  }
  return node_id_;
}

absl::StatusOr<pb::ClusterState> CoordinatorClient::DrainSelf() {
  pb::DrainRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) {
      return absl::FailedPreconditionError("not registered with the coordinator at " +
                                           options_.coordinator_address);
    }
    request.set_node_id(node_id_);
  }
  pb::DrainResponse response;
  if (absl::Status s =
          rpc_->Call(&pb::Coordinator::Stub::Drain, request, &response, options_.rpc_timeout);
      !s.ok()) {
    return s;
  }
  pb::ClusterState state;
  if (absl::Status s = rpc_->Call(&pb::Coordinator::Stub::GetClusterState,
                                  pb::GetClusterStateRequest(), &state, options_.rpc_timeout);
      !s.ok()) {
    return s;
  }
  return state;
}

void CoordinatorClient::SetLoad(const pb::LoadStats& load) {
  absl::MutexLock lock(&mu_);
  load_ = load;
}

void CoordinatorClient::SetAppliedPlacementVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  if (version == applied_placement_version_) return;
  applied_placement_version_ = version;
  heartbeat_now_ = true;
}

pb::ClusterState CoordinatorClient::cluster_state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

void CoordinatorClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  pb::LeaveRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return;
    request.set_node_id(node_id_);
  }
  request.set_incarnation(incarnation_);
  pb::LeaveResponse response;
  const absl::Status status =
      rpc_->Call(&pb::Coordinator::Stub::Leave, request, &response, options_.rpc_timeout);
  if (!status.ok()) LOG(WARNING) << "Leave: " << status;
}

void CoordinatorClient::Loop() {
  absl::Duration backoff = kFirstBackoff;
  for (;;) {
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      registered = registered_;
    }
    absl::Duration wait = heartbeat_interval_;
    if (!registered) {
      if (Register()) {
        backoff = kFirstBackoff;
        FetchState();
      } else {
        wait = backoff;
        backoff = std::min(backoff * 2, options_.max_backoff);
      }
    } else {
      HeartbeatOnce();
      absl::MutexLock lock(&mu_);
      if (!registered_) wait = absl::ZeroDuration();  // told to register again: do it now
    }
    absl::MutexLock lock(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (heartbeat_now_ && registered_);
    };
    mu_.AwaitWithTimeout(absl::Condition(&wake), wait);
  }
}

bool CoordinatorClient::Register() {
  pb::RegisterRequest request;
  *request.mutable_node() = options_.node;
  pb::NodeInfo& node = *request.mutable_node();
  node.set_incarnation(incarnation_);
  if (node.pid() == 0) node.set_pid(getpid());
  if (node.host().empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    node.set_host(host);
  }
  {
    absl::MutexLock lock(&mu_);
    node.set_node_id(node_id_);
    *request.mutable_known_placement() = state_.placement();
  }
  pb::RegisterResponse response;
  const absl::Status status =
      rpc_->Call(&pb::Coordinator::Stub::Register, request, &response, options_.rpc_timeout);
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kAlreadyExists && node.node_id() != 0) {
      LOG(WARNING) << "node id " << node.node_id() << " is taken (" << status.message()
                   << "); registering as a new node";
      absl::MutexLock lock(&mu_);
      node_id_ = 0;
    } else {
      LOG_EVERY_N(WARNING, 20) << "Register with " << options_.coordinator_address << ": "
                               << status;
    }
    return false;
  }
  if (response.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  seen_placement_version_ = -1;  // fetch the state below regardless of versions
  LOG(INFO) << "registered with the coordinator as node " << response.node_id();
  absl::MutexLock lock(&mu_);
  node_id_ = response.node_id();
  registered_ = true;
  return true;
}

void CoordinatorClient::HeartbeatOnce() {
  pb::HeartbeatRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_node_id(node_id_);
    *request.mutable_load() = load_;
    request.set_applied_placement_version(applied_placement_version_);
    heartbeat_now_ = false;
  }
  request.set_incarnation(incarnation_);
  if (options_.take_broken_device_channels) {
    for (uint64_t id : options_.take_broken_device_channels()) {
      if (std::find(unsent_broken_.begin(), unsent_broken_.end(), id) == unsent_broken_.end()) {
        unsent_broken_.push_back(id);
      }
    }
  }
  for (uint64_t id : unsent_broken_) request.add_broken_device_channels(id);
  pb::HeartbeatResponse response;
  const absl::Status status =
      rpc_->Call(&pb::Coordinator::Stub::Heartbeat, request, &response, options_.rpc_timeout);
  if (!status.ok()) {
    LOG_EVERY_N(WARNING, 20) << "Heartbeat to " << options_.coordinator_address << ": " << status;
    return;
  }
  // Delivered; with unknown_node, the ids are of channels a coordinator that forgot this node
  // (it restarted, or declared it LEFT) no longer issues.
  unsent_broken_.clear();
  if (response.unknown_node()) {
    LOG(INFO) << "the coordinator does not know node " << request.node_id()
              << " (it restarted?); registering again";
    absl::MutexLock lock(&mu_);
    registered_ = false;
    return;
  }
  if (response.placement_version() != seen_placement_version_ ||
      response.members_version() != seen_members_version_) {
    FetchState();
  }
  if (response.drain() && !drain_reported_) {
    drain_reported_ = true;
    if (callbacks_.on_drain) callbacks_.on_drain();
  }
}

void CoordinatorClient::FetchState() {
  pb::ClusterState state;
  const absl::Status status = rpc_->Call(&pb::Coordinator::Stub::GetClusterState,
                                         pb::GetClusterStateRequest(), &state,
                                         options_.rpc_timeout);
  if (!status.ok()) {
    LOG_EVERY_N(WARNING, 20) << "GetClusterState: " << status;
    return;
  }
  if (state.recovering()) {
    // A restarted coordinator that has not relearned every live node yet: acting on its partial
    // view would drop links and workers that serve. Keep the last state; fetch again with the
    // next heartbeat.
    VLOG(1) << "the coordinator is relearning the cluster; keeping the last cluster state";
    seen_placement_version_ = -1;
    return;
  }
  seen_placement_version_ = state.placement().version();
  seen_members_version_ = state.members_version();
  {
    absl::MutexLock lock(&mu_);
    state_ = state;
  }
  if (callbacks_.on_cluster_state) callbacks_.on_cluster_state(state);
}

}  // namespace k3
