#include "launcher/cluster_plan.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/node_process.h"

namespace k3 {
namespace {

// The TLS flags as a node's arguments.
std::vector<std::string> TlsArgs(const TlsFlags& tls) {
  std::vector<std::string> args;
  const std::pair<const char*, const std::string*> flags[] = {{"--tls-cert", &tls.cert},
                                                              {"--tls-key", &tls.key},
                                                              {"--tls-ca", &tls.ca},
                                                              {"--tls-server-name",
                                                               &tls.server_name}};
  for (const auto& [flag, value] : flags) {
    if (!value->empty()) args.insert(args.end(), {flag, *value});
  }
  return args;
}

NodeSite Site(const LocalClusterOptions& o, NodeRole role) {
  auto it = o.sites.find(role);
  return it == o.sites.end() ? NodeSite() : it->second;
}

// Builds the plan's nodes in order; node i takes ports[i] (and ports[count + i] for metrics).
class NodePlanner {
 public:
  NodePlanner(const LocalClusterOptions& o, const ClusterPlanInputs& in)
      : o_(o),
        in_(in),
        count_(PlannedNodeCount(o)),
        coordinator_(HostPort(Site(o, NodeRole::kCoordinator).host, in.ports[0])) {}

  void Add(NodeRole role, int index, const std::vector<std::string>& args) {
    const int i = static_cast<int>(nodes_.size());
    PlannedNode node;
    node.role = role;
    node.index = index;
    node.name = role == NodeRole::kCoordinator ? "coordinator"
                                               : absl::StrCat(NodeRoleName(role), "-", index);
    const std::string host = Site(o_, role).host;
    node.grpc_address = HostPort(host, in_.ports[i]);
    node.argv = {in_.binary, NodeRoleName(role)};
    if (role == NodeRole::kHttp) {
      // Not a cluster member: it calls the attention nodes, and --port is its HTTP API.
      node.http_address = HostPort(host, in_.http_port);
      node.argv.insert(node.argv.end(), {"--server", absl::StrJoin(AttentionAddresses(), ","),
                                         "--port", absl::StrCat(in_.http_port), "--grpc-port",
                                         absl::StrCat(in_.ports[i])});
    } else {
      if (role != NodeRole::kCoordinator) {
        node.argv.insert(node.argv.end(), {"--coordinator", coordinator_});
      }
      node.argv.insert(node.argv.end(), {"--port", absl::StrCat(in_.ports[i])});
    }
    node.argv.insert(node.argv.end(), {"--model", in_.model, "--host", host});
    if (o_.metrics) {
      node.metrics_address = HostPort(host, in_.ports[count_ + i]);
      node.argv.insert(node.argv.end(), {"--metrics-port", absl::StrCat(in_.ports[count_ + i])});
    }
    const std::vector<std::string> tls_args = TlsArgs(o_.tls);
    node.argv.insert(node.argv.end(), tls_args.begin(), tls_args.end());
    if (!o_.auth_token_file.empty() && (role == NodeRole::kAttention || role == NodeRole::kHttp)) {
      node.argv.insert(node.argv.end(), {"--auth-token-file", o_.auth_token_file});
    }
    node.argv.insert(node.argv.end(), args.begin(), args.end());
    if (auto extra = o_.extra_args.find(role); extra != o_.extra_args.end()) {
      node.argv.insert(node.argv.end(), extra->second.begin(), extra->second.end());
    }
    nodes_.push_back(std::move(node));
  }

  std::vector<PlannedNode> Take() { return std::move(nodes_); }

 private:
  std::vector<std::string> AttentionAddresses() const {
    std::vector<std::string> addresses;
    for (const PlannedNode& node : nodes_) {
      if (node.role == NodeRole::kAttention) addresses.push_back(node.grpc_address);
    }
    return addresses;
  }

  const LocalClusterOptions& o_;
  const ClusterPlanInputs& in_;
  const int count_;
  const std::string coordinator_;
  std::vector<PlannedNode> nodes_;
};

}  // namespace

const char* NodeRoleName(NodeRole role) {
  constexpr const char* kNames[] = {"coordinator", "attention", "router", "expert", "http"};
  const auto index = static_cast<size_t>(role);  // kNames is in enum order
  return index < std::size(kNames) ? kNames[index] : "?";
}

int SpareExpertSlots(const LocalClusterOptions& options, int num_experts) {
  auto extra = options.extra_args.find(NodeRole::kCoordinator);
  if (extra != options.extra_args.end() &&
      std::find(extra->second.begin(), extra->second.end(), "--spare-slots-per-worker") !=
          extra->second.end()) {
    return 0;  // set by hand
  }
  if (options.spare_expert_slots >= 0) return options.spare_expert_slots;
  if (options.experts < 2 || num_experts == 0) return 0;
  return (num_experts + options.experts - 1) / options.experts;
}

int SplitKernelThreads(int hardware_threads, int data_plane_nodes) {
  return std::max(1, hardware_threads / std::max(1, data_plane_nodes));
}

absl::Status CheckNodeCounts(const LocalClusterOptions& o) {
  if (o.attention < 1 || o.routers < 1 || o.experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cluster needs at least one attention node and one router (got ",
                     o.attention, " attention, ", o.routers, " routers, ", o.experts, " experts)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> PlanExpertSlots(const LocalClusterOptions& o, int num_experts) {
  if ((num_experts > 0) != (o.experts > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", num_experts,
                                                   " routed experts per layer but the cluster ",
                                                   o.experts, " expert nodes"));
  }
  std::vector<int> slots = o.expert_slots;
  if (slots.empty() && o.experts > 0) {
    slots.assign(o.experts, (num_experts + o.experts - 1) / o.experts);
  }
  if (static_cast<int>(slots.size()) != o.experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(slots.size(), " expert slot counts for ", o.experts, " expert nodes"));
  }
  int total_slots = 0;
  for (int s : slots) {
    if (s < 1) return absl::InvalidArgumentError("expert slot counts must be at least 1");
    total_slots += s;
  }
  if (total_slots < num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert slots sum to ", total_slots, ", fewer than the model's ", num_experts, " experts"));
  }
  if (o.node_threads < 0 || o.node_threads > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("node threads ", o.node_threads, " out of range [0, 4096]"));
  }
  if (o.http_port < -1 || o.http_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP port ", o.http_port, " out of range"));
  }
  return slots;
}

int PlannedNodeCount(const LocalClusterOptions& o) {
  return 1 + o.attention + o.routers + o.experts + (o.http_port >= 0 ? 1 : 0);
}

int PlannedPortCount(const LocalClusterOptions& o) {
  return o.metrics ? 2 * PlannedNodeCount(o) : PlannedNodeCount(o);
}

absl::StatusOr<std::vector<int>> ConsecutivePorts(const LocalClusterOptions& o) {
  const int needed = PlannedPortCount(o);
  if (o.base_port < 1 || o.base_port + needed - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "base port ", o.base_port, " leaves no room for ", needed, " ports below 65536"));
  }
  std::vector<int> ports;
  for (int i = 0; i < needed; ++i) ports.push_back(o.base_port + i);
  return ports;
}

ClusterPlan PlanCluster(const LocalClusterOptions& o, const ClusterPlanInputs& in) {
  ClusterPlan plan;
  plan.node_threads = o.node_threads > 0 ? o.node_threads
                                         : SplitKernelThreads(in.hardware_threads,
                                                              o.attention + o.routers + o.experts);
  plan.attention_threads =
      o.node_threads > 0 ? o.node_threads : SplitKernelThreads(in.hardware_threads, o.attention);
  NodePlanner planner(o, in);
  // A fresh cluster has no members to relearn, so the coordinator needs no recovery window.
  std::vector<std::string> coordinator_args = {
      "--expected-experts", absl::StrCat(o.experts), "--required-roles",
      o.experts > 0 ? "attention,router,expert" : "attention,router", "--recovery-window-ms", "0"};
  if (const int spare = SpareExpertSlots(o, in.num_experts); spare > 0) {
    coordinator_args.insert(coordinator_args.end(),
                            {"--spare-slots-per-worker", absl::StrCat(spare)});
  }
  planner.Add(NodeRole::kCoordinator, 0, coordinator_args);
  // Attention nodes drain within half the stop grace, so SIGTERM rarely needs a SIGKILL after it.
  const int64_t drain_ms = absl::ToInt64Milliseconds(o.stop_grace / 2);
  for (int i = 0; i < o.attention; ++i) {
    planner.Add(NodeRole::kAttention, i, {"--drain-timeout-ms", absl::StrCat(drain_ms)});
  }
  for (int i = 0; i < o.routers; ++i) planner.Add(NodeRole::kRouter, i, {});
  for (int i = 0; i < o.experts; ++i) {
    planner.Add(NodeRole::kExpert, i, {"--slots", absl::StrCat(in.expert_slots[i])});
  }
  if (o.http_port >= 0) planner.Add(NodeRole::kHttp, 0, {});
  plan.nodes = planner.Take();
  return plan;
}

}  // namespace k3
