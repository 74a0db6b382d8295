#include "coordinator/rpc_fan_out.h"

#include "grpcpp/support/channel_arguments.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

std::vector<NodeAddress> AliveMembers(const pb::ClusterState& state, pb::Role role) {
  std::vector<NodeAddress> nodes;
  for (const pb::Member& m : state.members()) {
    if (m.node().role() == role && m.state() == pb::ALIVE) {
      nodes.push_back({m.node().node_id(), m.node().grpc_address()});
    }
  }
  return nodes;
}

std::vector<std::string> Addresses(const std::vector<NodeAddress>& nodes) {
  std::vector<std::string> addresses;
  for (const NodeAddress& n : nodes) addresses.push_back(n.address);
  return addresses;
}

void RpcFanOut::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  // Cancelled calls end soon; their callbacks use this object.
  mu_.Await(absl::Condition(
      +[](int* outstanding) { return *outstanding == 0; }, &outstanding_));
}

bool RpcFanOut::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

std::shared_ptr<grpc::Channel> RpcFanOut::ChannelTo(const std::string& address) {
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  // A layer's QB histograms are num_experts x bins x 8 bytes: far beyond gRPC's 4 MB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel = tls_.Connect(address, args);
  channels_.emplace(address, channel);
  return channel;
}

}  // namespace k3
