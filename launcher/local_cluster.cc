#include "launcher/local_cluster.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/grpc_server.h"
#include "cluster/grpc_status.h"
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

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

// The kernel's ephemeral port range (net.ipv4.ip_local_port_range): where bind() to port 0 and
// every outgoing connect() take their local port from.
std::pair<int, int> EphemeralPortRange() {
  int low = 32768, high = 60999;  // Linux's default
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int l = 0, h = 0;
  if (file >> l >> h && 0 < l && l <= h && h <= 65535) {
    low = l;
    high = h;
  }
  return {low, high};
}

// `n` ports that are free on this network namespace's wildcard address right now. All sockets
// stay bound until every port is known, so the ports differ from each other. The ports are
// drawn at random from outside the kernel's ephemeral range: a port released here and bound by
// its node a moment later could otherwise be taken in between as the local port of any
// process's outgoing connection (or a port-0 listener, such as UCX's), which on a busy machine
// (parallel tests, gRPC channels opening) happens. Outside the range only an explicit bind can
// take it, and random picks make two launchers on one machine unlikely to choose the same one.
// Where the range leaves too little room outside it, the kernel picks (port 0).
absl::StatusOr<std::vector<int>> PickFreePorts(int n) {
  const auto [low, high] = EphemeralPortRange();
  constexpr int kFirst = 10000;  // above the ports well-known services tend to use
  constexpr int kMinBand = 2000;
  int band_first = 0, band_last = -1;
  if (low - 1 - kFirst + 1 >= kMinBand) {
    band_first = kFirst;
    band_last = low - 1;
  } else if (65535 - (high + 1) + 1 >= kMinBand) {
    band_first = high + 1;
    band_last = 65535;
  }
  const bool random = band_last >= band_first;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> draw(random ? band_first : 0, random ? band_last : 0);

  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int attempt = 0; static_cast<int>(ports.size()) < n && status.ok(); ++attempt) {
    if (random && attempt >= 100 * n + 1000) {
      status = absl::UnavailableError(absl::StrCat("found only ", ports.size(), " of ", n,
                                                   " free ports in ", band_first, "-", band_last));
      break;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::InternalError(Errno("socket"));
      break;
    }
    sockaddr_in sa = {};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(draw(rng)));
    socklen_t len = sizeof(sa);
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      const int error = errno;
      close(fd);
      if (random && (error == EADDRINUSE || error == EACCES)) continue;  // draw another
      errno = error;
      status = absl::InternalError(Errno("picking a free port"));
      break;
    }
    fds.push_back(fd);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      status = absl::InternalError(Errno("picking a free port"));
      break;
    }
    ports.push_back(ntohs(sa.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

// True when `port` of `host` (an IP address) is bound by some socket now, as when another process
// took a port between PickFreePorts and the node's own bind. SO_REUSEADDR, as the servers set it,
// so a closed connection's TIME_WAIT does not count.
bool PortHeld(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string bare(absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
  if (getaddrinfo(bare.c_str(), absl::StrCat(port).c_str(), &hints, &found) != 0) return false;
  bool held = false;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    held = bind(fd, found->ai_addr, found->ai_addrlen) != 0 && errno == EADDRINUSE;
    close(fd);
  }
  freeaddrinfo(found);
  return held;
}

std::string DescribeExit(int status) {
  return status > 128 ? absl::StrCat("was killed by signal ", status - 128)
                      : absl::StrCat("exited with status ", status);
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address, const ClientTls& tls) {
  return tls.Connect(address);
}

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

}  // namespace

const char* NodeRoleName(NodeRole role) {
  switch (role) {
    case NodeRole::kCoordinator:
      return "coordinator";
    case NodeRole::kAttention:
      return "attention";
    case NodeRole::kRouter:
      return "router";
    case NodeRole::kExpert:
      return "expert";
    case NodeRole::kHttp:
      return "http";
  }
  return "?";
}

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
  absl::StatusOr<ClientTls> tls = LoadClientTls(o.tls);
  if (!tls.ok()) return tls.status();
  tls_ = *std::move(tls);
  if (o.attention < 1 || o.routers < 1 || o.experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cluster needs at least one attention node and one router (got ",
                     o.attention, " attention, ", o.routers, " routers, ", o.experts, " experts)"));
  }
  if (access(o.binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(Errno(absl::StrCat("k3serve binary ", o.binary)));
  }
  std::error_code ec;
  // The real path, so that ps shows k3serve rather than /proc/self/exe.
  const std::string binary = std::filesystem::canonical(o.binary, ec).string();
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("k3serve binary ", o.binary, ": ", ec.message()));
  }
  if (o.model.empty()) return absl::InvalidArgumentError("no model folder given");
  const std::string model = std::filesystem::absolute(o.model, ec).string();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", o.model, ": ", config.status().message()));
  }
  const int num_experts = config->num_experts;
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
  const int fronts = o.http_port >= 0 ? 1 : 0;
  const int count = 1 + o.attention + o.routers + o.experts + fronts;
  int http_port = o.http_port;
  if (http_port == 0) {
    absl::StatusOr<std::vector<int>> picked = PickPorts(1);
    if (!picked.ok()) return picked.status();
    http_port = (*picked)[0];
  }
  std::vector<int> ports;
  if (o.base_port == 0) {
    absl::StatusOr<std::vector<int>> picked = PickPorts(o.metrics ? 2 * count : count);
    if (!picked.ok()) return picked.status();
    ports = *std::move(picked);
  } else {
    const int needed = o.metrics ? 2 * count : count;
    if (o.base_port < 1 || o.base_port + needed - 1 > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "base port ", o.base_port, " leaves no room for ", needed, " ports below 65536"));
    }
    for (int i = 0; i < needed; ++i) ports.push_back(o.base_port + i);
  }

  log_dir_ = o.log_dir;
  if (log_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/k3serve-local-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError(Errno(pattern));
    log_dir_ = pattern;
  } else if (std::filesystem::create_directories(log_dir_, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat("log folder ", log_dir_, ": ", ec.message()));
  }

  const int hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  node_threads_ = o.node_threads > 0
                      ? o.node_threads
                      : SplitKernelThreads(hardware_threads, o.attention + o.routers + o.experts);
  attention_threads_ =
      o.node_threads > 0 ? o.node_threads : SplitKernelThreads(hardware_threads, o.attention);
  auto site = [&](NodeRole role) {
    auto it = o.sites.find(role);
    return it == o.sites.end() ? NodeSite() : it->second;
  };
  const std::string coordinator = HostPort(site(NodeRole::kCoordinator).host, ports[0]);
  auto add = [&](NodeRole role, int index, std::vector<std::string> args) {
    const int i = static_cast<int>(nodes_.size());
    Node node;
    node.role = role;
    node.index = index;
    node.name = role == NodeRole::kCoordinator ? "coordinator"
                                               : absl::StrCat(NodeRoleName(role), "-", index);
    const std::string host = site(role).host;
    node.grpc_address = HostPort(host, ports[i]);
    node.log_path = absl::StrCat(log_dir_, "/", node.name, ".log");
    node.argv = {binary, NodeRoleName(role)};
    if (role == NodeRole::kHttp) {
      // Not a cluster member: it calls the attention nodes, and --port is its HTTP API.
      node.http_address = HostPort(host, http_port);
      node.argv.insert(node.argv.end(), {"--server", absl::StrJoin(generate_addresses(), ","),
                                         "--port", absl::StrCat(http_port), "--grpc-port",
                                         absl::StrCat(ports[i])});
    } else {
      if (role != NodeRole::kCoordinator) {
        node.argv.insert(node.argv.end(), {"--coordinator", coordinator});
      }
      node.argv.insert(node.argv.end(), {"--port", absl::StrCat(ports[i])});
    }
    node.argv.insert(node.argv.end(), {"--model", model, "--host", host});
    if (o.metrics) {
      node.metrics_address = HostPort(host, ports[count + i]);
      node.argv.insert(node.argv.end(), {"--metrics-port", absl::StrCat(ports[count + i])});
    }
    const std::vector<std::string> tls_args = TlsArgs(o.tls);
    node.argv.insert(node.argv.end(), tls_args.begin(), tls_args.end());
    if (!o.auth_token_file.empty() && (role == NodeRole::kAttention || role == NodeRole::kHttp)) {
      node.argv.insert(node.argv.end(), {"--auth-token-file", o.auth_token_file});
    }
    node.argv.insert(node.argv.end(), args.begin(), args.end());
    if (auto extra = o.extra_args.find(role); extra != o.extra_args.end()) {
      node.argv.insert(node.argv.end(), extra->second.begin(), extra->second.end());
    }
    nodes_.push_back(std::move(node));
  };
  // A fresh cluster has no members to relearn, so the coordinator needs no recovery window.
  std::vector<std::string> coordinator_args = {
      "--expected-experts", absl::StrCat(o.experts), "--required-roles",
      o.experts > 0 ? "attention,router,expert" : "attention,router", "--recovery-window-ms", "0"};
  if (const int spare = SpareExpertSlots(o, num_experts); spare > 0) {
    coordinator_args.insert(coordinator_args.end(),
                            {"--spare-slots-per-worker", absl::StrCat(spare)});
  }
  add(NodeRole::kCoordinator, 0, coordinator_args);
  // Attention nodes drain within half the stop grace, so SIGTERM rarely needs a SIGKILL after it.
  const int64_t drain_ms = absl::ToInt64Milliseconds(o.stop_grace / 2);
  for (int i = 0; i < o.attention; ++i) {
    add(NodeRole::kAttention, i, {"--drain-timeout-ms", absl::StrCat(drain_ms)});
  }
  for (int i = 0; i < o.routers; ++i) add(NodeRole::kRouter, i, {});
  for (int i = 0; i < o.experts; ++i) {
    add(NodeRole::kExpert, i, {"--slots", absl::StrCat(slots[i])});
  }
  if (fronts > 0) add(NodeRole::kHttp, 0, {});
  return absl::OkStatus();
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

absl::Status LocalCluster::Launch(Node& node) {
  NodeSite site;
  if (auto it = options_.sites.find(node.role); it != options_.sites.end()) site = it->second;
  const bool data_plane = node.role == NodeRole::kAttention || node.role == NodeRole::kRouter ||
                          node.role == NodeRole::kExpert;
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
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (site.env.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : site.env) env_strings.push_back(absl::StrCat(key, "=", value));
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
  const char* netns_name = site.netns.c_str();
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaction(sig, &dfl, nullptr);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(null, 0);
    dup2(log, 1);
    dup2(log, 2);
    if (netns >= 0) {
      // What `ip netns exec` does: join the network namespace, then mount a sysfs of it in a
      // private mount namespace, where UCX looks for network devices (/sys/class/net).
      if (setns(netns, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
          mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
          umount2("/sys", MNT_DETACH) != 0 || mount(netns_name, "/sys", "sysfs", 0, nullptr) != 0) {
        static const char kMessage[] = "k3serve local: entering the network namespace failed\n";
        (void)!write(2, kMessage, sizeof(kMessage) - 1);
        _exit(127);
      }
    }
    execve(argv[0], argv.data(), envp.data());
    static const char kMessage[] = "k3serve local: exec failed\n";
    (void)!write(2, kMessage, sizeof(kMessage) - 1);
    _exit(127);
  }
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
  absl::StatusOr<std::vector<int>> ports = PickPorts(2);
  if (!ports.ok()) return ports.status();
  Node node;
  node.role = NodeRole::kExpert;
  node.index = count;
  node.name = absl::StrCat(NodeRoleName(NodeRole::kExpert), "-", count);
  node.argv = first->argv;
  node.log_path = absl::StrCat(log_dir_, "/", node.name, ".log");
  const std::string host = first->grpc_address.substr(0, first->grpc_address.rfind(':'));
  node.grpc_address = HostPort(host, (*ports)[0]);
  for (size_t i = 0; i + 1 < node.argv.size(); ++i) {
    if (node.argv[i] == "--port") node.argv[i + 1] = absl::StrCat((*ports)[0]);
    if (node.argv[i] == "--slots") node.argv[i + 1] = absl::StrCat(slots);
    if (node.argv[i] == "--metrics-port") {
      node.argv[i + 1] = absl::StrCat((*ports)[1]);
      node.metrics_address = HostPort(host, (*ports)[1]);
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
