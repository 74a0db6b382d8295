#include "launcher/local_cluster.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/grpc_server.h"
#include "cluster/grpc_status.h"
#include "cluster/node_process.h"
#include "launcher/free_ports.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "model/config.h"
#include "proto/cluster.grpc.pb.h"

extern char** environ;

namespace k3 {

namespace pb = k3serve::cluster::v1;

namespace {

// The readiness health service of each node role (see the role headers).
const char* ReadinessService(NodeRole role) {
  switch (role) {
    case NodeRole::kCoordinator:
      return "k3serve.cluster.v1.Coordinator";
    case NodeRole::kAttention:
      return "k3serve.v1.K3Serve";
    case NodeRole::kRouter:
      return "k3serve.cluster.v1.RouterControl";
    case NodeRole::kExpert:
      return "k3serve.cluster.v1.ExpertWorker";
    case NodeRole::kHttp:
      return "";  // the process serves HTTP as soon as its health service answers
  }
  return "";
}
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

std::string Errno(const std::string& what) { return absl::StrCat(what, ": ", strerror(errno)); }

std::string DescribeExit(int status) {
  return status > 128 ? absl::StrCat("was killed by signal ", status - 128)
                      : absl::StrCat("exited with status ", status);
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address, const ClientTls& tls) {
  return tls.Connect(address);
}

// The launcher's environment with `overrides` added or replacing its entries, as KEY=VALUE.
std::vector<std::string> ChildEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (overrides.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

// What a forked child needs, prepared before fork: after it, in a process with other threads,
// the child may only make async-signal-safe calls until exec.
struct ChildSetup {
  char** argv;
  char** envp;
  int log;                 // stdout and stderr
  int null;                // stdin
  int netns;               // network namespace to join; -1: the launcher's
  const char* netns_name;  // its name, as the source of the sysfs mount
  pid_t parent;            // the launcher
  sigset_t signal_mask = {};  // the child's (empty)
};

// In the child: its own process group, death with the launcher, default signal handling, the
// log as output, the network namespace, then exec. Never returns.
[[noreturn]] void RunChild(const ChildSetup& c) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != c.parent) _exit(127);  // the launcher died before prctl took effect
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaction(sig, &dfl, nullptr);
  sigprocmask(SIG_SETMASK, &c.signal_mask, nullptr);
  dup2(c.null, 0);
  dup2(c.log, 1);
  dup2(c.log, 2);
  if (c.netns >= 0) {
    // What `ip netns exec` does: join the network namespace, then mount a sysfs of it in a
    // private mount namespace, where UCX looks for network devices (/sys/class/net).
    if (setns(c.netns, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 || mount(c.netns_name, "/sys", "sysfs", 0, nullptr) != 0) {
      static const char kMessage[] = "k3serve local: entering the network namespace failed\n";
      (void)!write(2, kMessage, sizeof(kMessage) - 1);
      _exit(127);
    }
  }
  execve(c.argv[0], c.argv, c.envp);
  static const char kMessage[] = "k3serve local: exec failed\n";
  (void)!write(2, kMessage, sizeof(kMessage) - 1);
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options));
  if (absl::Status s = cluster->Plan(); !s.ok()) {
    cluster->stopped_ = true;  // nothing runs yet
    return s;
  }
  const absl::Time deadline = absl::Now() + options.startup_timeout;
  cluster->starting_ = true;
  absl::Status status = cluster->Launch(cluster->nodes_[0]);
  if (status.ok()) status = cluster->WaitCoordinatorUp(deadline);
  for (size_t i = 1; i < cluster->nodes_.size() && status.ok(); ++i) {
    // Experts before routers before attention nodes: each tier connects to the one below.
    status = cluster->Launch(cluster->nodes_[cluster->nodes_.size() - i]);
  }
  if (status.ok()) status = cluster->WaitReady(deadline);
  cluster->starting_ = false;
  if (!status.ok()) {
    cluster->Stop().IgnoreError();  // the startup error is the one worth reporting
    return status;
  }
  return cluster;
}

LocalCluster::~LocalCluster() {
  if (absl::Status s = Stop(); !s.ok()) Progress(std::string(s.message()));
}

absl::Status LocalCluster::Plan() {
  const LocalClusterOptions& o = options_;
  K3_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(o.tls));
  tls_ = std::move(tls);
  K3_RETURN_IF_ERROR(CheckNodeCounts(o));
  ClusterPlanInputs in;
  K3_RETURN_IF_ERROR(ResolvePaths(&in));
  K3_ASSIGN_OR_RETURN(std::vector<int> slots, PlanExpertSlots(o, in.num_experts));
  in.expert_slots = std::move(slots);
  in.http_port = o.http_port;
  if (in.http_port == 0) {
    K3_ASSIGN_OR_RETURN(std::vector<int> picked, PickPorts(1));
    in.http_port = picked[0];
  }
  K3_ASSIGN_OR_RETURN(std::vector<int> ports,
                      o.base_port == 0 ? PickPorts(PlannedPortCount(o)) : ConsecutivePorts(o));
  in.ports = std::move(ports);
  K3_RETURN_IF_ERROR(MakeLogDir());
  in.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());

  ClusterPlan plan = PlanCluster(o, in);
  node_threads_ = plan.node_threads;
  attention_threads_ = plan.attention_threads;
  for (PlannedNode& planned : plan.nodes) {
    Node node;
    node.name = std::move(planned.name);
    node.role = planned.role;
    node.index = planned.index;
    node.argv = std::move(planned.argv);
    node.grpc_address = std::move(planned.grpc_address);
    node.metrics_address = std::move(planned.metrics_address);
    node.http_address = std::move(planned.http_address);
    node.log_path = absl::StrCat(log_dir_, "/", node.name, ".log");
    nodes_.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::ResolvePaths(ClusterPlanInputs* in) const {
  const LocalClusterOptions& o = options_;
  if (access(o.binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(Errno(absl::StrCat("k3serve binary ", o.binary)));
  }
  std::error_code ec;
  // The real path, so that ps shows k3serve rather than /proc/self/exe.
  in->binary = std::filesystem::canonical(o.binary, ec).string();
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("k3serve binary ", o.binary, ": ", ec.message()));
  }
  if (o.model.empty()) return absl::InvalidArgumentError("no model folder given");
  in->model = std::filesystem::absolute(o.model, ec).string();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(in->model);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", o.model, ": ", config.status().message()));
  }
  in->num_experts = config->num_experts;
  return absl::OkStatus();
}

absl::Status LocalCluster::MakeLogDir() {
  log_dir_ = options_.log_dir;
  std::error_code ec;
  if (log_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/k3serve-local-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError(Errno(pattern));
    log_dir_ = pattern;
  } else if (std::filesystem::create_directories(log_dir_, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat("log folder ", log_dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Launch(Node& node) {
  NodeSite site;
  if (auto it = options_.sites.find(node.role); it != options_.sites.end()) site = it->second;
  const bool data_plane = node.role == NodeRole::kAttention || node.role == NodeRole::kRouter ||
                          node.role == NodeRole::kExpert;
  if (options_.nccl_host_per_node &&
      (node.role == NodeRole::kAttention || node.role == NodeRole::kExpert)) {
    site.env["NCCL_HOSTID"] = node.name;
  }
  if (data_plane && site.env.count("K3SERVE_THREADS") == 0 &&
      std::getenv("K3SERVE_THREADS") == nullptr) {
    site.env["K3SERVE_THREADS"] =
        absl::StrCat(node.role == NodeRole::kAttention ? attention_threads_ : node_threads_);
  }

  // Everything the child needs is prepared before fork: after it, in a process with other
  // threads, the child may only make async-signal-safe calls until exec.
  std::vector<char*> argv;
  for (std::string& arg : node.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = ChildEnvironment(site.env);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const int log = open(node.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(Errno(node.log_path));
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int netns = -1;
  if (!site.netns.empty()) {
    const std::string path = absl::StrCat("/run/netns/", site.netns);
    netns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns < 0) {
      close(log);
      close(null);
      return absl::FailedPreconditionError(Errno(absl::StrCat("network namespace ", path)));
    }
  }
  ChildSetup child{argv.data(), envp.data(), log, null, netns, site.netns.c_str(), getpid()};
  sigemptyset(&child.signal_mask);

  const pid_t pid = fork();
  if (pid == 0) RunChild(child);
  const int fork_errno = errno;
  close(log);
  close(null);
  if (netns >= 0) close(netns);
  if (pid < 0) {
    errno = fork_errno;
    return absl::InternalError(Errno("fork"));
  }
  node.pid = pid;
  node.exit_status = 0;
  Progress(absl::StrCat("started ", node.name, " (pid ", pid, ") on ", node.grpc_address,
                        site.netns.empty() ? "" : absl::StrCat(" in netns ", site.netns),
                        node.metrics_address.empty()
                            ? ""
                            : absl::StrCat(", metrics on ", node.metrics_address),
                        ", log ", node.log_path));
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitCoordinatorUp(absl::Time deadline) {
  Node& coordinator = nodes_[0];
  while (true) {
    Poll(coordinator);
    if (coordinator.pid < 0 && !RelaunchOnTakenPort(coordinator)) return ExitedError(coordinator);
    // A fresh channel each time: a reused one would wait out its reconnect backoff after the
    // first attempt found nothing listening yet.
    absl::StatusOr<bool> serving =
        CheckServing(Channel(coordinator.grpc_address, tls_), "", absl::Milliseconds(500));
    if (serving.ok() && *serving) return absl::OkStatus();
    if (options_.cancelled && options_.cancelled()) {
      return absl::CancelledError("cancelled while the coordinator started");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the coordinator did not answer on ", coordinator.grpc_address, " in time; the end of ",
          coordinator.log_path, ":\n", LogTail(coordinator.log_path)));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status LocalCluster::WaitReady(absl::Time deadline) {
  std::string last;
  while (true) {
    Reap();
    for (Node& node : nodes_) {
      if (node.pid < 0 && !RelaunchOnTakenPort(node)) return ExitedError(node);
    }
    std::string coordinator_says;
    bool ready = false;
    absl::StatusOr<pb::ClusterState> state = GetClusterState(absl::Seconds(1));
    if (state.ok()) {
      ready = state->ready();
      coordinator_says =
          ready ? "ready" : absl::StrCat("waiting (", state->not_ready_reason(), ")");
    } else {
      coordinator_says = absl::StrCat("unreachable (", state.status().message(), ")");
    }
    // The coordinator's readiness only says every role has a live member; each node's own
    // readiness says it can work (a router's placement is in force, an expert's slice loaded).
    std::map<NodeRole, int> serving;
    for (const Node& node : nodes_) {
      if (node.role == NodeRole::kCoordinator) continue;
      absl::StatusOr<bool> up =
          CheckServing(Channel(node.grpc_address, tls_), ReadinessService(node.role),
                       absl::Seconds(1));
      if (up.ok() && *up) ++serving[node.role];
    }
    const int fronts = options_.http_port >= 0 ? 1 : 0;
    const bool all_serving = serving[NodeRole::kAttention] == options_.attention &&
                             serving[NodeRole::kRouter] == options_.routers &&
                             serving[NodeRole::kExpert] == options_.experts &&
                             serving[NodeRole::kHttp] == fronts;
    const std::string line =
        absl::StrCat("cluster: coordinator ", coordinator_says, "; serving: attention ",
                     serving[NodeRole::kAttention], "/", options_.attention, ", routers ",
                     serving[NodeRole::kRouter], "/", options_.routers, ", experts ",
                     serving[NodeRole::kExpert], "/", options_.experts,
                     fronts > 0 ? absl::StrCat(", http ", serving[NodeRole::kHttp], "/1") : "");
    if (line != last) {
      Progress(line);
      last = line;
    }
    if (ready && all_serving) return absl::OkStatus();
    if (options_.cancelled && options_.cancelled()) {
      return absl::CancelledError("cancelled while the cluster started");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the cluster was not ready in time: ", line, "; logs in ", log_dir_));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::StatusOr<pb::ClusterState> LocalCluster::GetClusterState(absl::Duration timeout) const {
  auto stub = pb::Coordinator::NewStub(Channel(coordinator_address(), tls_));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  pb::ClusterState state;
  const grpc::Status status = stub->GetClusterState(&context, pb::GetClusterStateRequest(), &state);
  if (!status.ok()) return FromGrpcStatus(status);
  return state;
}

bool LocalCluster::Poll(Node& node) {
  if (node.pid < 0) return false;
  int status = 0;
  const pid_t r = waitpid(node.pid, &status, WNOHANG);
  if (r != node.pid) return false;
  node.exit_status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  node.pid = -1;
  return true;
}

std::vector<const LocalCluster::Node*> LocalCluster::Reap() {
  std::vector<const Node*> exited;
  for (Node& node : nodes_) {
    if (Poll(node)) exited.push_back(&node);
  }
  return exited;
}

absl::StatusOr<std::vector<int>> LocalCluster::PickPorts(int n) const {
  return options_.pick_ports ? options_.pick_ports(n) : PickFreePorts(n);
}

bool LocalCluster::RelaunchOnTakenPort(Node& node) {
  if (!starting_ || options_.base_port != 0 || node.port_relaunches >= kMaxPortRelaunches) {
    return false;
  }
  if (auto site = options_.sites.find(node.role);
      site != options_.sites.end() && !site->second.netns.empty()) {
    return false;  // its ports live in another network namespace: nothing to probe from here
  }
  const std::string host = node.grpc_address.substr(0, node.grpc_address.rfind(':'));
  // The node's listening ports: its gRPC and metrics ports, an HTTP front's API port.
  std::vector<std::pair<size_t, int>> taken;  // argv index of the value, the port
  for (size_t i = 0; i + 1 < node.argv.size(); ++i) {
    const std::string& flag = node.argv[i];
    if (flag != "--port" && flag != "--metrics-port" && flag != "--grpc-port") continue;
    int port = 0;
    if (absl::SimpleAtoi(node.argv[i + 1], &port) && PortHeld(host, port)) {
      // An HTTP port the user chose is theirs to change: its being taken is an error.
      if (node.role == NodeRole::kHttp && flag == "--port" && options_.http_port > 0) {
        return false;
      }
      taken.emplace_back(i + 1, port);
    }
  }
  if (taken.empty()) return false;  // it failed for a reason of its own
  absl::StatusOr<std::vector<int>> fresh = PickPorts(static_cast<int>(taken.size()));
  if (!fresh.ok()) return false;
  for (size_t k = 0; k < taken.size(); ++k) {
    const std::string old_address = HostPort(host, taken[k].second);
    const std::string new_address = HostPort(host, (*fresh)[k]);
    Progress(absl::StrCat(node.name, " could not listen on ", old_address,
                          " (another process took the port); starting it again on ",
                          new_address));
    node.argv[taken[k].first] = absl::StrCat((*fresh)[k]);
    for (std::string* address : {&node.grpc_address, &node.metrics_address, &node.http_address}) {
      if (*address == old_address) *address = new_address;
    }
    // Nodes started later find the coordinator at its new address. (Only the coordinator is
    // named in other nodes' flags before they start; it starts first, alone.)
    if (node.role == NodeRole::kCoordinator) {
      for (Node& other : nodes_) {
        for (std::string& arg : other.argv) {
          if (&other != &node && arg == old_address) arg = new_address;
        }
      }
    }
  }
  if (node.role == NodeRole::kAttention) {
    // The HTTP front was started with the attention nodes' addresses.
    for (Node& front : nodes_) {
      if (front.role != NodeRole::kHttp) continue;
      for (size_t i = 0; i + 1 < front.argv.size(); ++i) {
        if (front.argv[i] == "--server") {
          front.argv[i + 1] = absl::StrJoin(generate_addresses(), ",");
        }
      }
      if (front.pid >= 0) {
        kill(front.pid, SIGKILL);
        int status = 0;
        while (waitpid(front.pid, &status, 0) < 0 && errno == EINTR) {
        }
        front.pid = -1;
        if (!Launch(front).ok()) return false;
      }
    }
  }
  ++node.port_relaunches;
  return Launch(node).ok();
}

absl::Status LocalCluster::CheckRunning() {
  Reap();
  for (const Node& node : nodes_) {
    if (node.pid < 0) return ExitedError(node);
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::ExitedError(const Node& node) const {
  return absl::UnavailableError(absl::StrCat(node.name, " ", DescribeExit(node.exit_status),
                                             "; the end of ", node.log_path, ":\n",
                                             LogTail(node.log_path)));
}

absl::StatusOr<const LocalCluster::Node*> LocalCluster::node(const std::string& name) const {
  for (const Node& n : nodes_) {
    if (n.name == name) return &n;
  }
  return absl::NotFoundError(absl::StrCat("no node called ", name));
}

LocalCluster::Node* LocalCluster::Find(const std::string& name) {
  for (Node& n : nodes_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

std::vector<std::string> LocalCluster::generate_addresses() const {
  std::vector<std::string> addresses;
  for (const Node& node : nodes_) {
    if (node.role == NodeRole::kAttention) addresses.push_back(node.grpc_address);
  }
  return addresses;
}

std::string LocalCluster::http_address() const {
  for (const Node& node : nodes_) {
    if (node.role == NodeRole::kHttp) return node.http_address;
  }
  return "";
}

std::string LocalCluster::front_grpc_address() const {
  for (const Node& node : nodes_) {
    if (node.role == NodeRole::kHttp) return node.grpc_address;
  }
  return "";
}

absl::Status LocalCluster::Signal(const std::string& name, int signal) {
  Node* node = Find(name);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node called ", name));
  Poll(*node);
  if (node->pid < 0) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is not running"));
  }
  if (kill(node->pid, signal) != 0) return absl::InternalError(Errno(absl::StrCat("kill ", name)));
  return absl::OkStatus();
}

absl::StatusOr<int> LocalCluster::WaitExit(const std::string& name, absl::Duration timeout) {
  Node* node = Find(name);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node called ", name));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    Poll(*node);
    if (node->pid < 0) return node->exit_status;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " still runs after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status LocalCluster::Restart(const std::string& name) {
  Node* node = Find(name);
  if (node == nullptr) return absl::NotFoundError(absl::StrCat("no node called ", name));
  Poll(*node);
  if (node->pid >= 0) return absl::FailedPreconditionError(absl::StrCat(name, " is running"));
  return Launch(*node);
}

absl::StatusOr<std::string> LocalCluster::AddExpertNode(int slots) {
  const Node* first = nullptr;
  int count = 0;
  for (const Node& node : nodes_) {
    if (node.role != NodeRole::kExpert) continue;
    if (first == nullptr) first = &node;
    ++count;
  }
  if (first == nullptr) return absl::FailedPreconditionError("the cluster has no expert node");
  K3_ASSIGN_OR_RETURN(std::vector<int> ports, PickPorts(2));
  Node node;
  node.role = NodeRole::kExpert;
  node.index = count;
  node.name = absl::StrCat(NodeRoleName(NodeRole::kExpert), "-", count);
  node.argv = first->argv;
  node.log_path = absl::StrCat(log_dir_, "/", node.name, ".log");
  const std::string host = first->grpc_address.substr(0, first->grpc_address.rfind(':'));
  node.grpc_address = HostPort(host, ports[0]);
  for (size_t i = 0; i + 1 < node.argv.size(); ++i) {
    if (node.argv[i] == "--port") node.argv[i + 1] = absl::StrCat(ports[0]);
    if (node.argv[i] == "--slots") node.argv[i + 1] = absl::StrCat(slots);
    if (node.argv[i] == "--metrics-port") {
      node.argv[i + 1] = absl::StrCat(ports[1]);
      node.metrics_address = HostPort(host, ports[1]);
    }
  }
  nodes_.push_back(std::move(node));
  if (absl::Status launched = Launch(nodes_.back()); !launched.ok()) {
    nodes_.pop_back();
    return launched;
  }
  return nodes_.back().name;
}

absl::Status LocalCluster::Stop() {
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  std::vector<std::string> problems;
  // Attention nodes first: they stop admitting and finish (or end with "shutting down") the
  // streams in flight while the front still relays them.
  for (NodeRole tier : {NodeRole::kAttention, NodeRole::kHttp, NodeRole::kRouter,
                        NodeRole::kExpert, NodeRole::kCoordinator}) {
    std::vector<Node*> running;
    for (Node& node : nodes_) {
      Poll(node);
      if (node.role == tier && node.pid >= 0) running.push_back(&node);
    }
    for (Node* node : running) kill(node->pid, SIGTERM);
    const absl::Time deadline = absl::Now() + options_.stop_grace;
    for (Node* node : running) {
      while (node->pid >= 0 && absl::Now() < deadline) {
        if (!Poll(*node)) absl::SleepFor(absl::Milliseconds(10));
      }
      if (node->pid >= 0) {
        problems.push_back(absl::StrCat(node->name, " ignored SIGTERM for ",
                                        absl::FormatDuration(options_.stop_grace),
                                        " and was killed"));
        kill(node->pid, SIGKILL);
        int status = 0;
        while (waitpid(node->pid, &status, 0) < 0 && errno == EINTR) {
        }
        node->exit_status = 128 + SIGKILL;
        node->pid = -1;
      } else if (node->exit_status != 0) {
        problems.push_back(absl::StrCat(node->name, " ", DescribeExit(node->exit_status),
                                        " on SIGTERM; the end of ", node->log_path, ":\n",
                                        LogTail(node->log_path, 5)));
      }
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("unclean stop: ", absl::StrJoin(problems, "; ")));
}

std::string LocalCluster::LogTail(const std::string& path, int lines) {
  std::ifstream file(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(file, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

void LocalCluster::Progress(const std::string& line) const {
  if (options_.progress) options_.progress(line);
}

}  // namespace k3
