// ClusterPlan: what a LocalCluster (local_cluster.h) starts, computed from its options without
// processes, files or clocks: every node's name, addresses and command line, and the kernel
// threads each node gets. LocalCluster resolves the inputs (the binary's and model's paths, the
// model's expert count, the ports, the hardware threads) and runs the plan.
//
// The rules (also in local_cluster.h's file comment): nodes in the order coordinator, attention
// nodes, routers, expert nodes, then the HTTP front; node i of that order listens on ports[i] and,
// with metrics, serves /metrics on ports[count + i]. The coordinator expects `experts` expert
// nodes, needs no recovery window (a fresh cluster has no members to relearn) and gets the spare
// slots SpareExpertSlots names; attention nodes drain within half the stop grace; expert node i
// gets its slot count; the HTTP front calls every attention node and serves HTTP on http_port.
//
// Thread-safety: plain functions and values.
#ifndef K3SERVE_LAUNCHER_CLUSTER_PLAN_H_
#define K3SERVE_LAUNCHER_CLUSTER_PLAN_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/command_line.h"

namespace k3 {

// NodeRoleName lists the names in this order.
enum class NodeRole { kCoordinator, kAttention, kRouter, kExpert, kHttp };

// "coordinator", "attention", "router", "expert", "http": the subcommand of the role.
const char* NodeRoleName(NodeRole role);

// Where the nodes of one role run.
struct NodeSite {
  // Address the nodes listen on and advertise; the launcher reaches the coordinator and the
  // attention nodes here.
  std::string host = "127.0.0.1";
  // Network namespace (ip netns) to run in; empty: the launcher's.
  std::string netns;
  // Added to (or replacing in) the launcher's environment, e.g. UCX_TLS, UCX_NET_DEVICES.
  std::map<std::string, std::string> env;
};

struct LocalClusterOptions {
  std::string binary = "/proc/self/exe";  // the k3serve executable
  std::string model;                      // checkpoint folder with config.json
  int attention = 1;
  int routers = 1;
  int experts = 1;
  // Expert slots (experts per MoE layer) of each expert node, `experts` of them, summing to at
  // least the model's num_experts; the coordinator gives each node a contiguous slice of the
  // experts proportional to its slots. Empty: ceil(num_experts / experts) each.
  std::vector<int> expert_slots;
  // Spare expert slots per MoE layer of each expert node (the coordinator's
  // --spare-slots-per-worker), filled with replicas of the next nodes' experts, so that a killed
  // expert node costs no request and a drained one can hand its experts over. -1: each node's
  // share (ceil(num_experts / experts), every expert on two nodes) when there are two expert
  // nodes or more, else 0. A coordinator --spare-slots-per-worker in extra_args wins.
  int spare_expert_slots = -1;
  int base_port = 0;                   // see the file comment; 0 picks free ports
  // The OpenAI-compatible HTTP front (`k3serve http`, in front of every attention node; its gRPC
  // health port is one of the ports above, after the experts'): its HTTP port, 0 for a free one;
  // -1: no front.
  int http_port = -1;
  bool metrics = false;                // give every node an HTTP /metrics port
  // Each attention and expert node gets its own NCCL_HOSTID (its name), so that NCCL takes GPU
  // nodes sharing one GPU for different hosts and the coordinator gives them device channels
  // (cluster/gpu_device_channels.h): the GPU-to-GPU path tested on one GPU, over NCCL's socket
  // transport instead of peer access.
  bool nccl_host_per_node = false;
  std::string log_dir;                 // empty: a new folder under $TMPDIR (or /tmp)
  std::map<NodeRole, NodeSite> sites;  // roles not listed run on loopback here
  // TLS flags given to every node (and used by the launcher's own health checks); a bearer token
  // file given to the attention nodes and the HTTP front. Empty: none (README "Security").
  TlsFlags tls;
  std::string auth_token_file;
  // Extra flags for every node of a role, appended after the launcher's own.
  std::map<NodeRole, std::vector<std::string>> extra_args;
  absl::Duration startup_timeout = absl::Seconds(60);
  // Per tier at Stop (attention nodes first: they stop admitting and finish their streams within
  // half of it, while the HTTP front relays them; then the front, routers, expert nodes and the
  // coordinator): SIGTERM, then SIGKILL for nodes still running after this long.
  absl::Duration stop_grace = absl::Seconds(5);
  // Startup progress lines (which nodes are up, what the coordinator still waits for). Null:
  // silent.
  std::function<void(const std::string&)> progress;
  // Polled while waiting for the cluster; true gives up (Start and WaitReady answer CANCELLED),
  // e.g. when the user pressed Ctrl-C. Null: never.
  std::function<bool()> cancelled;
  // Kernel threads (K3SERVE_THREADS) of each attention, router and expert node. 0: routers and
  // experts get this machine's hardware threads split evenly among all of those nodes (at least 1
  // each), since they all run here and poll for each other's messages: more busy threads than
  // cores means a woken worker waits for a core a poller holds (measured on 2 cores, A1/R1/E2 on
  // k3-tiny: 1 thread each is 2.9x the cluster tokens/s of 2 each). Attention nodes split the
  // hardware threads among themselves only: an attention worker's compute is on every token's
  // path while the tiers behind it wait, and its extra threads block while it waits for them and
  // are woken only for products big enough to repay it (RestKernelThreads, WakeKernelThreads;
  // measured on 2 cores, A1/R1/E2, one stream: k3-perf 1.1-1.2x the tokens/s of 1 thread,
  // k3-tiny within the noise; 8 streams, where ping-pong micro-batches make the tiers compute at
  // the same time, no worse). K3SERVE_THREADS in the launcher's or a site's environment wins.
  int node_threads = 0;
  // Picks `n` distinct ports for the nodes when base_port is 0. Null: free ports drawn at random
  // (see the file comment). Tests hand out a port that is already taken here.
  std::function<absl::StatusOr<std::vector<int>>(int n)> pick_ports;
};

// The coordinator's --spare-slots-per-worker that `options` asks for (see spare_expert_slots) on a
// model with `num_experts` routed experts per layer; 0: none (or set by hand in extra_args).
int SpareExpertSlots(const LocalClusterOptions& options, int num_experts);

// The even split of `hardware_threads` among `data_plane_nodes` processes, at least 1 each.
int SplitKernelThreads(int hardware_threads, int data_plane_nodes);

// INVALID_ARGUMENT unless there is at least one attention node and one router and no negative
// count of expert nodes.
absl::Status CheckNodeCounts(const LocalClusterOptions& options);

// The expert slots of each expert node (options.expert_slots, or an even share of `num_experts`);
// INVALID_ARGUMENT when the model and the options disagree on having experts, the counts do not
// match the expert nodes, one is below 1 or they cannot hold `num_experts`. Also checks
// node_threads and http_port ranges.
absl::StatusOr<std::vector<int>> PlanExpertSlots(const LocalClusterOptions& options,
                                                 int num_experts);

// Nodes a cluster of `options` runs (coordinator, attention, routers, experts, HTTP front).
int PlannedNodeCount(const LocalClusterOptions& options);

// Ports the nodes need: one per node, two with metrics.
int PlannedPortCount(const LocalClusterOptions& options);

// base_port, base_port + 1, ...: PlannedPortCount of them; INVALID_ARGUMENT past 65535.
absl::StatusOr<std::vector<int>> ConsecutivePorts(const LocalClusterOptions& options);

// What PlanCluster needs beyond the options, resolved by the caller.
struct ClusterPlanInputs {
  std::string binary;             // the k3serve executable's real path
  std::string model;              // the model folder's absolute path
  int num_experts = 0;            // the model's routed experts per layer
  std::vector<int> expert_slots;  // PlanExpertSlots
  std::vector<int> ports;         // PlannedPortCount of them
  int http_port = -1;             // the HTTP front's API port (when options.http_port >= 0)
  int hardware_threads = 1;       // this machine's
};

struct PlannedNode {
  std::string name;  // "coordinator", "attention-0", "router-1", "expert-2", "http-0"
  NodeRole role = NodeRole::kCoordinator;
  int index = 0;  // within its role
  std::vector<std::string> argv;
  std::string grpc_address;     // host:port
  std::string metrics_address;  // host:port, empty without metrics
  std::string http_address;     // host:port of the HTTP front's API; empty for other roles
};

struct ClusterPlan {
  std::vector<PlannedNode> nodes;  // in start order reversed: coordinator first
  int node_threads = 1;            // K3SERVE_THREADS of routers and experts
  int attention_threads = 1;       // K3SERVE_THREADS of attention nodes
};

// The plan for `options` (already checked by CheckNodeCounts and PlanExpertSlots).
ClusterPlan PlanCluster(const LocalClusterOptions& options, const ClusterPlanInputs& inputs);

}  // namespace k3

#endif  // K3SERVE_LAUNCHER_CLUSTER_PLAN_H_
