#include "cluster/ucx_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/ucx_address.h"
#include "glog/logging.h"

namespace k3 {
namespace {

constexpr unsigned kAmId = 0x4b33;  // every message travels as this active message id
// Received buffers are lent only at addresses aligned for any scalar a message holds (UCX's
// shared-memory buffers are 8-byte aligned; moe_wire's in-place decoding needs 4).
constexpr uintptr_t kLentAlignment = alignof(double);

// Liveness socket frames: magic, type, token (16 bytes, little-endian).
constexpr uint32_t kFrameMagic = 0x564c334b;
constexpr size_t kFrameSize = 16;
enum FrameType : uint32_t { kHello = 1, kHelloAck = 2, kBye = 3, kByeAck = 4 };

// Processes with the same key share a kernel and a network namespace: loopback reaches them, and
// so (usually) does shared memory.
std::string HostKey() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st = {};
  uint64_t netns = stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
  return absl::StrCat(boot_id, "/", netns);
}

// Whether UCX may pick a shared-memory transport under `tls` (UCX_TLS syntax).
bool SharedMemoryEnabled(std::string tls) {
  if (tls.empty()) {
    const char* env = getenv("UCX_TLS");
    tls = env == nullptr ? "" : env;
  }
  if (tls.empty()) return true;
  bool exclude = tls[0] == '^';
  if (exclude) tls.erase(0, 1);
  std::set<std::string> names;
  for (absl::string_view name : absl::StrSplit(tls, ',')) names.insert(std::string(name));
  if (exclude)
    return !(names.count("sm") || names.count("shm") ||
             (names.count("posix") && names.count("sysv")));
  for (const char* name : {"all", "sm", "shm", "posix", "sysv"}) {
    if (names.count(name)) return true;
  }
  return false;
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

void SetKeepalive(int fd) {
  int on = 1, idle = 2, interval = 1, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

bool WriteFrame(int fd, uint32_t type, uint64_t token) {
  std::string frame;
  AppendLittleEndian(frame, kFrameMagic, 4);
  AppendLittleEndian(frame, type, 4);
  AppendLittleEndian(frame, token, 8);
  return send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(frame.size());
}

bool ParseFrame(const std::string& bytes, uint32_t* type, uint64_t* token) {
  LittleEndianReader r(bytes);
  uint64_t magic = 0, t = 0;
  if (!r.Le(4, &magic) || magic != kFrameMagic || !r.Le(4, &t) || !r.Le(8, token)) return false;
  *type = static_cast<uint32_t>(t);
  return true;
}

int MillisUntil(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(deadline - absl::Now() + absl::Microseconds(999))));
}

// Opens the liveness socket to `ip:port` and shakes hands: HELLO with our token, HELLO_ACK with
// theirs, which must be `expected_token`.
absl::StatusOr<int> DialLiveness(uint32_t ip, uint16_t port, uint64_t our_token,
                                 uint64_t expected_token, absl::Time deadline) {
  const std::string where = absl::StrCat(Ipv4String(ip), ":", port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  auto fail = [&](const std::string& why) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot reach ", where, ": ", why));
  };
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = ip;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    return fail(Errno("connect"));
  }
  pollfd p = {fd, POLLOUT, 0};
  if (poll(&p, 1, MillisUntil(deadline)) != 1) return fail("connect timed out");
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return fail(absl::StrCat("connect: ", strerror(error)));
  if (!WriteFrame(fd, kHello, our_token)) return fail(Errno("send"));
  std::string reply;
  while (reply.size() < kFrameSize) {
    p = {fd, POLLIN, 0};
    if (poll(&p, 1, MillisUntil(deadline)) != 1) return fail("no answer to the handshake");
    char buf[kFrameSize];
    ssize_t n = recv(fd, buf, kFrameSize - reply.size(), 0);
    if (n == 0) return fail("connection closed during the handshake");
    if (n < 0 && errno != EAGAIN && errno != EINTR) return fail(Errno("recv"));
    if (n > 0) reply.append(buf, n);
  }
  uint32_t type = 0;
  uint64_t token = 0;
  if (!ParseFrame(reply, &type, &token) || type != kHelloAck) {
    return fail("not a k3serve transport");
  }
  if (token != expected_token) {
    return fail("a different process listens there now (the address is stale)");
  }
  SetKeepalive(fd);
  return fd;
}

}  // namespace

struct UcxTransport::Remote {
  enum class State {
    kUp,       // usable (Send needs `ep` too: only our own Connect creates one)
    kClosing,  // we are closing it gracefully
    kClosed,   // closed gracefully, by either side
    kFailed,
  };

  UcxTransport* transport = nullptr;
  uint64_t token = 0;
  std::string where;  // ip:port, for messages
  bool bound = false;
  PeerId peer = 0;
  ucp_ep_h ep = nullptr;
  bool ep_errored = false;  // UCX reported an error: only a forced close is allowed
  State state = State::kUp;
  bool flush_pending = false;
  int acks_awaited = 0;
};

struct UcxTransport::Conn {
  int fd = -1;
  uint64_t serial = 0;
  uint64_t token = 0;  // 0 until the handshake named the remote
  std::string buffer;
  bool awaiting_ack = false;
};

struct UcxTransport::SendOp {
  UcxTransport* transport;
  Remote* remote;
  uint64_t header;
  std::string data;
};

struct UcxTransport::RecvOp {
  UcxTransport* transport;
  Inbox::Slot slot;
  std::string data;
};

// Between the transport and the borrowers of its receive buffers. `mu` is a leaf lock (taken under
// the transport's mu_, never the other way round), so a borrower may let go anywhere, even while
// holding the Inbox's or the transport's lock.
struct UcxTransport::Lender {
  absl::Mutex mu;
  // Buffers let go of, for the next driver to release.
  std::vector<void*> returned ABSL_GUARDED_BY(mu);
  // Whether `returned` may be non-empty: read without the lock by drivers polling UCX in a loop.
  std::atomic<bool> any_returned{false};
  // Lent and not yet released to UCX (returned ones included).
  int64_t outstanding ABSL_GUARDED_BY(mu) = 0;
  // Set when the transport closed while buffers were still lent: the last one given back
  // releases itself into this worker and then destroys the worker and the context.
  ucp_worker_h orphan_worker ABSL_GUARDED_BY(mu) = nullptr;
  ucp_context_h orphan_context ABSL_GUARDED_BY(mu) = nullptr;

  // Empties `returned` (those buffers are no longer lent) for the caller to release to UCX.
  std::vector<void*> TakeReturned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<void*> taken;
    taken.swap(returned);
    outstanding -= static_cast<int64_t>(taken.size());
    any_returned.store(false, std::memory_order_relaxed);
    return taken;
  }

  void GiveBack(void* data) {
    absl::MutexLock lock(&mu);
    if (orphan_worker == nullptr) {
      returned.push_back(data);
      any_returned.store(true, std::memory_order_release);
      return;
    }
    ucp_am_data_release(orphan_worker, data);
    if (--outstanding > 0) return;
    ucp_worker_destroy(orphan_worker);
    orphan_worker = nullptr;
    if (orphan_context != nullptr) ucp_cleanup(orphan_context);
    orphan_context = nullptr;
  }
};

struct UcxTransport::CloseOp {
  UcxTransport* transport;
  Remote* remote_to_acknowledge;  // answer its BYE once closed; null for none
};

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  std::unique_ptr<UcxTransport> transport(new UcxTransport(options));
  absl::Status status = transport->Init();
  if (!status.ok()) return status;
  return transport;
}

UcxTransport::UcxTransport(const UcxTransportOptions& options)
    : options_(options), token_([] {
        std::random_device random;
        uint64_t token = 0;
        while (token == 0) token = (uint64_t{random()} << 32) ^ random();
        return token;
      }()),
      lender_(std::make_shared<Lender>()) {}

absl::Status UcxTransport::Init() {
  host_key_ = HostKey();
  shared_memory_enabled_ = SharedMemoryEnabled(options_.tls);

  UcxAddress address;
  address.token = token_;
  address.host_key = host_key_;
  if (options_.advertise_ips.empty()) {
    ifaddrs* interfaces = nullptr;
    if (getifaddrs(&interfaces) != 0) return absl::InternalError(Errno("getifaddrs"));
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP)) continue;
      address.ips.push_back(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    }
    freeifaddrs(interfaces);
  } else {
    for (const std::string& text : options_.advertise_ips) {
      in_addr ip = {};
      if (inet_pton(AF_INET, text.c_str(), &ip) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: '", text, "'"));
      }
      address.ips.push_back(ip.s_addr);
    }
  }
  if (address.ips.empty()) return absl::UnavailableError("no IPv4 interface is up");

  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return absl::InternalError(Errno("socket"));
  int on = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return absl::InternalError(Errno("liveness listener"));
  }
  address.port = ntohs(sa.sin_port);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(Errno("eventfd"));

  absl::MutexLock lock(&mu_);
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat("ucp_config_read: ", ucs_status_string(status)));
  }
  if (!options_.tls.empty()) status = ucp_config_modify(config, "TLS", options_.tls.c_str());
  if (status == UCS_OK && !options_.net_devices.empty()) {
    status = ucp_config_modify(config, "NET_DEVICES", options_.net_devices.c_str());
  }
  if (status == UCS_OK && !options_.eager_limit.empty() && getenv("UCX_RNDV_THRESH") == nullptr) {
    status = ucp_config_modify(config, "RNDV_THRESH", options_.eager_limit.c_str());
  }
  if (status != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX options tls='", options_.tls, "' net_devices='", options_.net_devices,
        "' eager_limit='", options_.eager_limit, "': ", ucs_status_string(status)));
  }
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    context_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("ucp_init (tls='", options_.tls, "'): ", ucs_status_string(status)));
  }
  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_params.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    worker_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ucp_worker_create: ", ucs_status_string(status)));
  }
  ucp_am_handler_param_t handler = {};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kAmId;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = &UcxTransport::OnActiveMessage;
  handler.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &handler);
  if (status == UCS_OK) status = ucp_worker_get_efd(worker_, &worker_fd_);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat("UCX worker setup: ", ucs_status_string(status)));
  }
  ucp_address_t* worker_address = nullptr;
  size_t worker_address_size = 0;
  status = ucp_worker_get_address(worker_, &worker_address, &worker_address_size);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat("ucp_worker_get_address: ", ucs_status_string(status)));
  }
  address.worker_address.assign(reinterpret_cast<const char*>(worker_address), worker_address_size);
  ucp_worker_release_address(worker_, worker_address);
  address_ = EncodeUcxAddress(address);

  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  Close();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

std::string UcxTransport::LocalAddress() const { return address_; }

std::string UcxTransport::DescribeLocked(const Remote& remote) const {
  if (remote.bound) return absl::StrCat("peer ", remote.peer, " (", remote.where, ")");
  return absl::StrCat("process at ", remote.where);
}

void UcxTransport::Wake() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

absl::Status UcxTransport::Connect(PeerId peer, const std::string& address) {
  absl::StatusOr<UcxAddress> parsed = DecodeUcxAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (parsed->token == token_) {
    return absl::InvalidArgumentError("cannot connect a transport to its own address");
  }
  const bool same_host = parsed->host_key == host_key_;
  // Validates the binding; returns OK with *done when it already exists.
  auto check = [&](bool* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    *done = false;
    if (closed_) return absl::FailedPreconditionError("transport closed");
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      const Remote& bound = *it->second;
      if (bound.state == Remote::State::kUp && bound.ep != nullptr) {
        if (bound.token == parsed->token) {
          *done = true;
          return absl::OkStatus();
        }
        return absl::AlreadyExistsError(
            absl::StrCat("peer ", peer, " is already bound to ", bound.where));
      }
    }
    for (const auto& [id, remote] : peers_) {
      if (id != peer && remote->token == parsed->token && remote->state == Remote::State::kUp &&
          remote->ep != nullptr) {
        return absl::AlreadyExistsError(absl::StrCat("that address is already bound to peer ", id));
      }
    }
    auto remote = remotes_.find(parsed->token);
    if (inbox_.Failed(parsed->token) ||
        (remote != remotes_.end() && remote->second->state == Remote::State::kFailed)) {
      return absl::UnavailableError(absl::StrCat("the process at that address failed"));
    }
    if (remote != remotes_.end() && remote->second->state == Remote::State::kClosing) {
      return absl::FailedPreconditionError("that process is being disconnected");
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    bool done = false;
    absl::Status status = check(&done);
    if (!status.ok() || done) return status;
  }

  // Loopback first for a process in our namespace; other hosts only through their real interfaces.
  std::vector<uint32_t> candidates;
  if (same_host) candidates.push_back(htonl(INADDR_LOOPBACK));
  for (uint32_t ip : parsed->ips) {
    if (!IsLoopbackIpv4(ip)) candidates.push_back(ip);
  }
  if (candidates.empty()) {
    return absl::UnavailableError("the address lists only loopback, and is from another host");
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::StatusOr<int> fd = absl::UnavailableError("no address tried");
  std::string errors;
  for (size_t i = 0; i < candidates.size(); ++i) {
    absl::Time attempt_deadline =
        std::min(deadline, absl::Now() + (deadline - absl::Now()) /
                                             static_cast<int64_t>(candidates.size() - i));
    fd = DialLiveness(candidates[i], parsed->port, token_, parsed->token, attempt_deadline);
    if (fd.ok()) break;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", fd.status().message());
  }
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrCat("connect to peer ", peer, " failed: ", errors));
  }
  sockaddr_in sa = {};
  socklen_t len = sizeof(sa);
  getpeername(*fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string where = absl::StrCat(Ipv4String(sa.sin_addr.s_addr), ":", parsed->port);

  absl::MutexLock lock(&mu_);
  bool done = false;
  absl::Status status = check(&done);
  if (!status.ok() || done) {
    close(*fd);
    return status;
  }
  std::shared_ptr<Remote>& remote = remotes_[parsed->token];
  if (remote == nullptr) {
    remote = std::make_shared<Remote>();
    remote->transport = this;
    remote->token = parsed->token;
  }
  // Shared memory cannot report peer failures in UCX 1.13; everything else can.
  const bool peer_failure_mode = !same_host || !shared_memory_enabled_;
  ucp_ep_params_t ep_params = {};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(parsed->worker_address.data());
  ep_params.err_mode = peer_failure_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep_params.err_handler.cb = &UcxTransport::OnEndpointError;
  ep_params.err_handler.arg = remote.get();
  ucp_ep_h ep = nullptr;
  ucs_status_t ucs = ucp_ep_create(worker_, &ep_params, &ep);
  if (ucs != UCS_OK) {
    close(*fd);
    return absl::UnavailableError(
        absl::StrCat("ucp_ep_create for peer ", peer, " at ", where, ": ", ucs_status_string(ucs)));
  }
  auto previous = peers_.find(peer);
  if (previous != peers_.end() && previous->second != remote) previous->second->bound = false;
  remote->where = where;
  remote->bound = true;
  remote->peer = peer;
  remote->ep = ep;
  remote->ep_errored = false;
  remote->state = Remote::State::kUp;
  peers_[peer] = remote;
  auto conn = std::make_unique<Conn>();
  conn->fd = *fd;
  conn->serial = next_conn_serial_++;
  conn->token = parsed->token;
  conns_[*fd] = std::move(conn);
  inbox_.Bind(parsed->token, peer);
  Wake();
  return absl::OkStatus();
}

void UcxTransport::Disconnect(PeerId peer) {
  std::shared_ptr<Remote> remote;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer);
    if (closed_ || it == peers_.end() || it->second->state != Remote::State::kUp) return;
    remote = it->second;
  }
  CloseGracefully({remote});
}

absl::Status UcxTransport::Send(PeerId peer, std::string message) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("transport closed");
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("peer ", peer, " is not connected"));
  }
  Remote& remote = *it->second;
  switch (remote.state) {
    case Remote::State::kFailed:
      return absl::UnavailableError(absl::StrCat(DescribeLocked(remote), " failed"));
    case Remote::State::kClosing:
    case Remote::State::kClosed:
      return absl::FailedPreconditionError(absl::StrCat(DescribeLocked(remote), " is closed"));
    case Remote::State::kUp:
      break;
  }
  if (remote.ep == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(DescribeLocked(remote), " closed the link; connect it again"));
  }
  auto* op = new SendOp{this, &remote, token_, std::move(message)};
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::OnSendDone;
  param.user_data = op;
  ucs_status_ptr_t request = ucp_am_send_nbx(remote.ep, kAmId, &op->header, sizeof(op->header),
                                             op->data.data(), op->data.size(), &param);
  if (request == nullptr) {
    delete op;
    return absl::OkStatus();
  }
  if (UCS_PTR_IS_ERR(request)) {
    delete op;
    std::string reason = absl::StrCat("send failed: ", ucs_status_string(UCS_PTR_STATUS(request)));
    FailLocked(remote, reason);
    Wake();
    return absl::UnavailableError(absl::StrCat(DescribeLocked(remote), " ", reason));
  }
  sends_.insert(op);
  Wake();
  return absl::OkStatus();
}

absl::StatusOr<Received> UcxTransport::Receive(absl::Time deadline) {
  return inbox_.Receive(deadline, [this](absl::Time until) { return TryDrive(until); });
}

void UcxTransport::Close() {
  std::vector<std::shared_ptr<Remote>> remotes;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (const auto& [token, remote] : remotes_) {
      if (remote->state == Remote::State::kUp) remotes.push_back(remote);
    }
  }
  CloseGracefully(remotes);
  {
    absl::MutexLock lock(&mu_);
    auto closes_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_closes_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&closes_done), absl::Now() + options_.close_timeout);
  }
  {
    absl::MutexLock lock(&baton_mu_);
    stopping_ = true;
  }
  Wake();
  if (progress_thread_.joinable()) progress_thread_.join();
  {
    // Keep the baton for good: no Receive caller may touch the worker from now on.
    absl::MutexLock lock(&baton_mu_);
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(baton_mu_) { return !driving_; };
    baton_mu_.Await(absl::Condition(&free));
    driving_ = true;
  }

  absl::MutexLock lock(&mu_);
  if (worker_ != nullptr) {
    for (const auto& [token, remote] : remotes_) {
      if (remote->ep != nullptr) {
        eps_to_force_close_.push_back(remote->ep);
        remote->ep = nullptr;
      }
    }
    ProgressLocked();
    const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
    while (pending_closes_ > 0 && absl::Now() < deadline) ucp_worker_progress(worker_);
    absl::MutexLock lend_lock(&lender_->mu);  // from here on borrowers wait, then see the orphan
    for (void* data : lender_->TakeReturned()) ucp_am_data_release(worker_, data);
    if (lender_->outstanding > 0) {
      // Borrowed receive buffers (in the Inbox or held by the owner) point into UCX's memory:
      // the last one given back destroys the worker and the context.
      lender_->orphan_worker = worker_;
      lender_->orphan_context = context_;
      context_ = nullptr;
    } else {
      ucp_worker_destroy(worker_);
    }
    worker_ = nullptr;
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  // The worker is gone: operations it never completed will not call back.
  for (SendOp* op : sends_) delete op;
  sends_.clear();
  for (RecvOp* op : recvs_) delete op;
  recvs_.clear();
  while (!conns_.empty()) CloseConnLocked(conns_.begin()->first);
  inbox_.Close();
}

void UcxTransport::CloseGracefully(const std::vector<std::shared_ptr<Remote>>& remotes) {
  const absl::Time deadline = absl::Now() + options_.close_timeout;
  absl::MutexLock lock(&mu_);
  if (worker_ == nullptr) return;
  std::vector<Remote*> closing;
  for (const std::shared_ptr<Remote>& remote : remotes) {
    if (remote->state != Remote::State::kUp) continue;
    remote->state = Remote::State::kClosing;
    closing.push_back(remote.get());
    if (remote->ep == nullptr || remote->ep_errored) continue;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::OnFlushDone;
    param.user_data = remote.get();
    ucs_status_ptr_t request = ucp_ep_flush_nbx(remote->ep, &param);
    if (UCS_PTR_IS_PTR(request)) remote->flush_pending = true;
  }
  if (closing.empty()) return;
  Wake();
  // 1. Everything we sent has arrived.
  auto flushed = [&closing]() {
    for (const Remote* remote : closing) {
      if (remote->flush_pending) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&flushed), deadline);
  // 2. BYE on every socket to each remote; it answers once its endpoint to us is closed.
  for (Remote* remote : closing) {
    for (auto& [fd, conn] : conns_) {
      if (conn->token != remote->token || conn->awaiting_ack) continue;
      if (WriteFrame(fd, kBye, token_)) {
        conn->awaiting_ack = true;
        ++remote->acks_awaited;
      }
    }
  }
  auto acknowledged = [&closing]() {
    for (const Remote* remote : closing) {
      if (remote->acks_awaited > 0) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&acknowledged), deadline);
  // 3. Close our endpoints; the remotes no longer use theirs.
  for (Remote* remote : closing) {
    CloseEndpointLocked(*remote, /*force=*/remote->ep_errored, /*acknowledge_when_done=*/false);
    CloseConnsOfLocked(remote->token);
    remote->flush_pending = false;
    remote->state = Remote::State::kClosed;
  }
  Wake();
}

void UcxTransport::ProgressLoop() {
  // After a receiver drove, the progress thread leaves the baton alone this long, so that a loop
  // of Receive calls keeps it without a hand-off each time.
  constexpr absl::Duration kLinger = absl::Milliseconds(2);
  constexpr absl::Duration kMaxWait = absl::Milliseconds(100);
  for (;;) {
    {
      absl::MutexLock lock(&baton_mu_);
      auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(baton_mu_) {
        return stopping_ || (!driving_ && receivers_waiting_ == 0);
      };
      baton_mu_.Await(absl::Condition(&free));
      if (stopping_) return;
      const absl::Duration rest = last_receiver_drive_ + kLinger - absl::Now();
      if (rest > absl::ZeroDuration()) {
        baton_mu_.AwaitWithTimeout(absl::Condition(&stopping_), rest);
        continue;
      }
      driving_ = true;
    }
    DriveOnce(absl::Now() + kMaxWait, absl::ZeroDuration());
    absl::MutexLock lock(&baton_mu_);
    driving_ = false;
  }
}

bool UcxTransport::TryDrive(absl::Time deadline) {
  {
    absl::MutexLock lock(&baton_mu_);
    if (stopping_) return false;
    if (driving_) {
      ++receivers_waiting_;
      Wake();  // the holder returns from poll; the progress thread then yields
      auto free = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(baton_mu_) { return !driving_ || stopping_; };
      baton_mu_.AwaitWithDeadline(absl::Condition(&free),
                                  std::min(deadline, absl::Now() + absl::Milliseconds(5)));
      --receivers_waiting_;
      if (driving_ || stopping_) return false;
    }
    driving_ = true;
  }
  DriveOnce(std::min(deadline, absl::Now() + absl::Milliseconds(100)), options_.busy_poll);
  absl::MutexLock lock(&baton_mu_);
  driving_ = false;
  last_receiver_drive_ = absl::Now();
  return true;
}

void UcxTransport::DriveOnce(absl::Time until, absl::Duration spin) {
  // After the first few microseconds a spinning receiver yields its core between polls, so that
  // where busy processes outnumber cores it does not hold up the process whose answer it waits
  // for (a yield costs about a microsecond when nothing else wants the core). An answer from a
  // peer on a core of its own often comes within those first microseconds.
  constexpr absl::Duration kSpinWithoutYield = absl::Microseconds(5);
  const absl::Time start = absl::Now();
  const absl::Time spin_until = std::min(until, start + spin);
  for (;;) {
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      if (worker_ == nullptr) return;
      // Whatever UCX has already is handled now; it may be what the caller waits for.
      if (ProgressLocked()) return;
      now = absl::Now();
      if (now >= spin_until) break;
    }
    if (now - start >= kSpinWithoutYield) sched_yield();
  }
  int timeout_ms = 0;
  {
    absl::MutexLock lock(&mu_);
    if (worker_ == nullptr) return;
    ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) return;
    if (status != UCS_OK) LOG(ERROR) << "ucp_worker_arm: " << ucs_status_string(status);
    poll_fds_.clear();
    poll_serials_.clear();
    poll_fds_.push_back({wake_fd_, POLLIN, 0});
    poll_fds_.push_back({worker_fd_, POLLIN, 0});
    poll_fds_.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, conn] : conns_) {
      poll_fds_.push_back({fd, POLLIN, 0});
      poll_serials_.push_back(conn->serial);
    }
    // UCX signals the event fd for receives and completions; the short timeout while operations
    // are pending is a safety net for the few internal events that do not.
    const bool busy = !sends_.empty() || !recvs_.empty() || pending_closes_ > 0;
    timeout_ms = std::min(busy ? 1 : 100, MillisUntil(until));
  }
  if (poll(poll_fds_.data(), poll_fds_.size(), timeout_ms) < 0 && errno != EINTR) {
    PLOG(ERROR) << "poll";
  }
  absl::MutexLock lock(&mu_);
  if (worker_ == nullptr) return;
  if (poll_fds_[0].revents != 0) {
    uint64_t count = 0;
    ssize_t ignored = read(wake_fd_, &count, sizeof(count));
    (void)ignored;
  }
  // Take in what UCX holds before looking at the sockets: messages a peer sent before dying are
  // delivered ahead of its failure.
  ProgressLocked();
  if (poll_fds_[2].revents != 0) AcceptLocked();
  for (size_t i = 3; i < poll_fds_.size(); ++i) {
    if (poll_fds_[i].revents == 0) continue;
    auto conn = conns_.find(poll_fds_[i].fd);
    if (conn == conns_.end() || conn->second->serial != poll_serials_[i - 3]) continue;
    ReadConnLocked(poll_fds_[i].fd);
  }
}

void UcxTransport::ReleaseReturnedLocked() {
  if (!lender_->any_returned.load(std::memory_order_acquire)) return;
  std::vector<void*> returned;
  {
    absl::MutexLock lock(&lender_->mu);
    returned = lender_->TakeReturned();
  }
  for (void* data : returned) ucp_am_data_release(worker_, data);
}

bool UcxTransport::ProgressLocked() {
  ReleaseReturnedLocked();
  bool progressed = false;
  while (ucp_worker_progress(worker_) != 0) progressed = true;
  while (!eps_to_force_close_.empty()) {
    std::vector<ucp_ep_h> eps = std::move(eps_to_force_close_);
    eps_to_force_close_.clear();
    for (ucp_ep_h ep : eps) {
      auto* op = new CloseOp{this, nullptr};
      ucp_request_param_t param = {};
      param.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      param.cb.send = &UcxTransport::OnCloseDone;
      param.user_data = op;
      ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(request)) {
        ++pending_closes_;
      } else {
        delete op;
      }
    }
    while (ucp_worker_progress(worker_) != 0) {
    }
    progressed = true;
  }
  return progressed;
}

void UcxTransport::AcceptLocked() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    SetKeepalive(fd);
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->serial = next_conn_serial_++;
    conns_[fd] = std::move(conn);
  }
}

void UcxTransport::ReadConnLocked(int fd) {
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    ConnLostLocked(fd);
    return;
  }
  Conn* conn = conns_[fd].get();
  conn->buffer.append(buf, n);
  const uint64_t serial = conn->serial;
  while (conn->buffer.size() >= kFrameSize) {
    uint32_t type = 0;
    uint64_t token = 0;
    if (!ParseFrame(conn->buffer.substr(0, kFrameSize), &type, &token)) {
      LOG(WARNING) << "UCX transport: garbage on a liveness socket; closing it";
      ConnLostLocked(fd);
      return;
    }
    conn->buffer.erase(0, kFrameSize);
    HandleFrameLocked(*conn, type, token);
    auto still = conns_.find(fd);
    if (still == conns_.end() || still->second->serial != serial) return;
  }
}

void UcxTransport::HandleFrameLocked(Conn& conn, uint32_t type, uint64_t token) {
  switch (type) {
    case kHello: {
      if (conn.token != 0 || token == 0 || token == token_ || closed_ || inbox_.Failed(token)) {
        CloseConnLocked(conn.fd);
        return;
      }
      std::shared_ptr<Remote>& remote = remotes_[token];
      if (remote == nullptr) {
        remote = std::make_shared<Remote>();
        remote->transport = this;
        remote->token = token;
        sockaddr_in sa = {};
        socklen_t len = sizeof(sa);
        getpeername(conn.fd, reinterpret_cast<sockaddr*>(&sa), &len);
        remote->where = Ipv4String(sa.sin_addr.s_addr);
      }
      if (remote->state == Remote::State::kFailed || remote->state == Remote::State::kClosing) {
        CloseConnLocked(conn.fd);
        return;
      }
      // A process that closed gracefully may connect again; our own endpoint to it stays closed
      // until our Connect.
      remote->state = Remote::State::kUp;
      conn.token = token;
      if (!WriteFrame(conn.fd, kHelloAck, token_)) ConnLostLocked(conn.fd);
      return;
    }
    case kBye: {
      auto it = remotes_.find(conn.token);
      if (it == remotes_.end()) return;
      Remote& remote = *it->second;
      if (remote.state == Remote::State::kClosing) {
        WriteFrame(conn.fd, kByeAck, token_);  // both sides are closing
      } else if (remote.state == Remote::State::kUp) {
        PeerClosingLocked(remote);
      }
      return;
    }
    case kByeAck:
      CloseConnLocked(conn.fd);
      return;
    default:
      LOG(WARNING) << "UCX transport: unexpected liveness frame type " << type;
      return;
  }
}

void UcxTransport::ConnLostLocked(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  const uint64_t token = it->second->token;
  CloseConnLocked(fd);
  auto remote = remotes_.find(token);
  if (token == 0 || remote == remotes_.end()) return;
  if (remote->second->state == Remote::State::kUp) {
    FailLocked(*remote->second, "its process exited or was killed (liveness connection lost)");
  }
}

void UcxTransport::CloseConnLocked(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second->awaiting_ack) {
    auto remote = remotes_.find(it->second->token);
    if (remote != remotes_.end()) --remote->second->acks_awaited;
  }
  close(fd);
  conns_.erase(it);
}

void UcxTransport::CloseConnsOfLocked(uint64_t token) {
  std::vector<int> fds;
  for (const auto& [fd, conn] : conns_) {
    if (conn->token == token) fds.push_back(fd);
  }
  for (int fd : fds) CloseConnLocked(fd);
}

void UcxTransport::PeerClosingLocked(Remote& remote) {
  remote.state = Remote::State::kClosed;
  CloseEndpointLocked(remote, /*force=*/remote.ep_errored, /*acknowledge_when_done=*/true);
}

void UcxTransport::AcknowledgeByeLocked(Remote& remote) {
  for (const auto& [fd, conn] : conns_) {
    if (conn->token == remote.token) WriteFrame(fd, kByeAck, token_);
  }
  CloseConnsOfLocked(remote.token);
}

void UcxTransport::FailLocked(Remote& remote, const std::string& reason) {
  if (remote.state == Remote::State::kFailed) return;
  remote.state = Remote::State::kFailed;
  remote.flush_pending = false;
  inbox_.Fail(remote.token,
              absl::UnavailableError(absl::StrCat(DescribeLocked(remote), " failed: ", reason)));
  if (remote.ep != nullptr) {
    eps_to_force_close_.push_back(remote.ep);
    remote.ep = nullptr;
  }
  CloseConnsOfLocked(remote.token);
}

void UcxTransport::CloseEndpointLocked(Remote& remote, bool force, bool acknowledge_when_done) {
  ucp_ep_h ep = remote.ep;
  remote.ep = nullptr;
  if (ep == nullptr) {
    if (acknowledge_when_done) AcknowledgeByeLocked(remote);
    return;
  }
  auto* op = new CloseOp{this, acknowledge_when_done ? &remote : nullptr};
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (force) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  param.cb.send = &UcxTransport::OnCloseDone;
  param.user_data = op;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) {
    ++pending_closes_;
    return;
  }
  delete op;
  if (acknowledge_when_done) AcknowledgeByeLocked(remote);
}

// The callbacks below run inside ucp calls, all of which are made with mu_ held.

ucs_status_t UcxTransport::OnActiveMessage(void* arg, const void* header, size_t header_length,
                                           void* data, size_t length,
                                           const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  uint64_t token = 0;
  const bool valid = header_length == sizeof(token);
  if (valid) memcpy(&token, header, sizeof(token));
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // The data is still at the sender: fetch it into a buffer of its size. Malformed messages are
    // fetched too (the sender's request completes) and then dropped.
    auto* op =
        new RecvOp{self, valid ? self->inbox_.Reserve(token) : nullptr, std::string(length, '\0')};
    ucp_request_param_t recv_param = {};
    recv_param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv_param.cb.recv_am = &UcxTransport::OnRecvDone;
    recv_param.user_data = op;
    ucs_status_ptr_t request =
        ucp_am_recv_data_nbx(self->worker_, data, op->data.data(), length, &recv_param);
    if (UCS_PTR_IS_PTR(request)) {
      self->recvs_.insert(op);
      return UCS_OK;
    }
    if (op->slot != nullptr) {
      if (request == nullptr) {
        self->inbox_.Fill(op->slot, std::move(op->data));
      } else {
        self->inbox_.Drop(op->slot);
      }
    }
    delete op;
    return UCS_OK;
  }
  if (!valid) {
    LOG(WARNING) << "UCX transport: dropped a message with a " << header_length << "-byte header";
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0 &&
      reinterpret_cast<uintptr_t>(data) % kLentAlignment == 0) {
    // Read where UCX put it (ucx_transport.h, "Receiving in place").
    {
      absl::MutexLock lock(&self->lender_->mu);
      ++self->lender_->outstanding;
    }
    self->inbox_.Deliver(token, MessageBytes::Lent(static_cast<const char*>(data), length,
                                                   [lender = self->lender_, data] {
                                                     lender->GiveBack(data);
                                                   }));
    return UCS_INPROGRESS;
  }
  self->inbox_.Deliver(token, std::string(static_cast<const char*>(data), length));
  return UCS_OK;
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* op = static_cast<RecvOp*>(user_data);
  op->transport->recvs_.erase(op);
  ucp_request_free(request);
  if (op->slot != nullptr) {
    if (status == UCS_OK) {
      op->data.resize(length);
      op->transport->inbox_.Fill(op->slot, std::move(op->data));
    } else {
      op->transport->inbox_.Drop(op->slot);
    }
  }
  delete op;
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  op->transport->sends_.erase(op);
  ucp_request_free(request);
  if (status != UCS_OK && op->remote->state == Remote::State::kUp) {
    op->transport->FailLocked(*op->remote,
                              absl::StrCat("send failed: ", ucs_status_string(status)));
  }
  delete op;
}

void UcxTransport::OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* remote = static_cast<Remote*>(user_data);
  ucp_request_free(request);
  remote->flush_pending = false;
  if (status != UCS_OK) remote->ep_errored = true;
}

void UcxTransport::OnCloseDone(void* request, ucs_status_t /*status*/, void* user_data) {
  auto* op = static_cast<CloseOp*>(user_data);
  ucp_request_free(request);
  --op->transport->pending_closes_;
  if (op->remote_to_acknowledge != nullptr) {
    op->transport->AcknowledgeByeLocked(*op->remote_to_acknowledge);
  }
  delete op;
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* remote = static_cast<Remote*>(arg);
  if (remote->ep != ep) return;  // an endpoint already being closed
  remote->ep_errored = true;
  if (remote->state == Remote::State::kUp) {
    remote->transport->FailLocked(*remote,
                                  absl::StrCat("UCX endpoint error: ", ucs_status_string(status)));
  }
}

}  // namespace k3
