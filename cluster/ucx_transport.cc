#include "cluster/ucx_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cluster/liveness_socket.h"
#include "cluster/ucx_address.h"
#include "cluster/ucx_worker.h"
#include "glog/logging.h"

namespace k3 {
namespace {

constexpr unsigned kAmId = 0x4b33;  // every message travels as this active message id

// Processes with the same key share a kernel and a network namespace: loopback reaches them, and
// so (usually) does shared memory.
std::string HostKey() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st = {};
  uint64_t netns = stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
  return absl::StrCat(boot_id, "/", netns);
}

}  // namespace

struct UcxTransport::Conn {
  int fd = -1;
  uint64_t serial = 0;
  uint64_t token = 0;  // 0 until the handshake named the remote
  std::string buffer;
  bool awaiting_ack = false;
};

struct UcxTransport::SendOp {
  UcxTransport* transport;
  UcxRemote* remote;
  uint64_t header;
  std::string data;
};

struct UcxTransport::CloseOp {
  UcxTransport* transport;
  UcxRemote* remote_to_acknowledge;  // answer its BYE once closed; null for none
};

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  std::unique_ptr<UcxTransport> transport(new UcxTransport(options));
  K3_RETURN_IF_ERROR(transport->Init());
  return transport;
}

UcxTransport::UcxTransport(const UcxTransportOptions& options)
    : options_(options),
      token_([] {
        std::random_device random;
        uint64_t token = 0;
        while (token == 0) token = (uint64_t{random()} << 32) ^ random();
        return token;
      }()),
      peers_(this),
      receiver_(&inbox_) {}

absl::Status UcxTransport::Init() {
  host_key_ = HostKey();
  shared_memory_enabled_ = SharedMemoryEnabled(options_.tls);

  UcxAddress address;
  address.token = token_;
  address.host_key = host_key_;
  K3_ASSIGN_OR_RETURN(std::vector<uint32_t> ips, AdvertisedIpv4s(options_.advertise_ips));
  address.ips = std::move(ips);
  K3_ASSIGN_OR_RETURN(LivenessListener listener, ListenForLiveness());
  listen_fd_ = listener.fd;
  address.port = listener.port;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));

  absl::MutexLock lock(&mu_);
  K3_ASSIGN_OR_RETURN(UcxWorker ucx,
                      CreateUcxWorker({options_.tls, options_.net_devices, options_.eager_limit},
                                      kAmId, &UcxReceiver::OnMessage, &receiver_));
  context_ = ucx.context;
  worker_ = ucx.worker;
  worker_fd_ = ucx.event_fd;
  receiver_.set_worker(worker_);
  K3_ASSIGN_OR_RETURN(std::string worker_address, UcxWorkerAddress(worker_));
  address.worker_address = std::move(worker_address);
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

void UcxTransport::Wake() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

absl::Status UcxTransport::Connect(PeerId peer, const std::string& address) {
  K3_ASSIGN_OR_RETURN(UcxAddress parsed, DecodeUcxAddress(address));
  if (parsed.token == token_) {
    return absl::InvalidArgumentError("cannot connect a transport to its own address");
  }
  const bool same_host = parsed.host_key == host_key_;
  {
    absl::MutexLock lock(&mu_);
    bool done = false;
    absl::Status status = CheckBindingLocked(peer, parsed.token, &done);
    if (!status.ok() || done) return status;
  }
  std::string where;
  K3_ASSIGN_OR_RETURN(int fd, DialPeer(peer, parsed, same_host, &where));

  absl::MutexLock lock(&mu_);
  bool done = false;
  absl::Status status = CheckBindingLocked(peer, parsed.token, &done);
  if (status.ok() && !done) status = BindLocked(peer, parsed, same_host, fd, where);
  if (!status.ok() || done) close(fd);
  return status;
}

absl::Status UcxTransport::CheckBindingLocked(PeerId peer, uint64_t token, bool* done) {
  *done = false;
  if (closed_) return absl::FailedPreconditionError("transport closed");
  return peers_.CheckBinding(peer, token, inbox_.Failed(token), done);
}

absl::StatusOr<int> UcxTransport::DialPeer(PeerId peer, const UcxAddress& address, bool same_host,
                                           std::string* where) {
  // Loopback first for a process in our namespace; other hosts only through their real interfaces.
  std::vector<uint32_t> candidates;
  if (same_host) candidates.push_back(htonl(INADDR_LOOPBACK));
  for (uint32_t ip : address.ips) {
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
    fd = DialLiveness(candidates[i], address.port, token_, address.token, attempt_deadline);
    if (fd.ok()) break;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", fd.status().message());
  }
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrCat("connect to peer ", peer, " failed: ", errors));
  }
  sockaddr_in sa = {};
  socklen_t len = sizeof(sa);
  getpeername(*fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *where = absl::StrCat(Ipv4String(sa.sin_addr.s_addr), ":", address.port);
  return fd;
}

absl::Status UcxTransport::BindLocked(PeerId peer, const UcxAddress& address, bool same_host,
                                      int fd, const std::string& where) {
  UcxRemote& remote = peers_.FindOrAdd(address.token);
  // Shared memory cannot report peer failures in UCX 1.13; everything else can.
  const bool peer_failure_mode = !same_host || !shared_memory_enabled_;
  ucp_ep_params_t ep_params = {};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(address.worker_address.data());
  ep_params.err_mode = peer_failure_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep_params.err_handler.cb = &UcxTransport::OnEndpointError;
  ep_params.err_handler.arg = &remote;
  ucp_ep_h ep = nullptr;
  ucs_status_t ucs = ucp_ep_create(worker_, &ep_params, &ep);
  if (ucs != UCS_OK) {
    return absl::UnavailableError(
        absl::StrCat("ucp_ep_create for peer ", peer, " at ", where, ": ", ucs_status_string(ucs)));
  }
  peers_.Bind(peer, remote, ep, where);
  auto conn = std::make_unique<Conn>();
  conn->fd = fd;
  conn->serial = next_conn_serial_++;
  conn->token = address.token;
  conns_[fd] = std::move(conn);
  inbox_.Bind(address.token, peer);
  Wake();
  return absl::OkStatus();
}

void UcxTransport::Disconnect(PeerId peer) {
  UcxRemote* remote = nullptr;
  {
    absl::MutexLock lock(&mu_);
    remote = peers_.Bound(peer);
    if (closed_ || remote == nullptr || remote->state != UcxRemote::State::kUp) return;
  }
  CloseGracefully({remote});
}

absl::Status UcxTransport::Send(PeerId peer, std::string message) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("transport closed");
  K3_ASSIGN_OR_RETURN(UcxRemote * sendable, peers_.ForSend(peer));
  UcxRemote& remote = *sendable;
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
    return absl::UnavailableError(absl::StrCat(remote.Describe(), " ", reason));
  }
  sends_.insert(op);
  Wake();
  return absl::OkStatus();
}

absl::StatusOr<Received> UcxTransport::Receive(absl::Time deadline) {
  return inbox_.Receive(deadline, [this](absl::Time until) { return TryDrive(until); });
}

void UcxTransport::Close() {
  std::vector<UcxRemote*> remotes;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    remotes = peers_.Up();
  }
  CloseGracefully(remotes);
  {
    absl::MutexLock lock(&mu_);
    auto closes_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_closes_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&closes_done), absl::Now() + options_.close_timeout);
  }
  baton_.Stop();
  Wake();
  if (progress_thread_.joinable()) progress_thread_.join();
  // Keep the baton for good: no Receive caller may touch the worker from now on.
  baton_.TakeForGood();

  absl::MutexLock lock(&mu_);
  if (worker_ != nullptr) {
    for (UcxRemote* remote : peers_.All()) {
      if (remote->ep != nullptr) {
        eps_to_force_close_.push_back(remote->ep);
        remote->ep = nullptr;
      }
    }
    ProgressLocked();
    const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
    while (pending_closes_ > 0 && absl::Now() < deadline) ucp_worker_progress(worker_);
    // Borrowed receive buffers (in the Inbox or held by the owner) point into UCX's memory: the
    // last one given back destroys the worker and the context (at once when none is borrowed).
    receiver_.Retire(std::make_unique<UcxRetiree>(UcxWorker{context_, worker_, worker_fd_}));
    worker_ = nullptr;
    context_ = nullptr;
  }
  // The worker is gone: operations it never completed will not call back.
  for (SendOp* op : sends_) delete op;
  sends_.clear();
  receiver_.ForgetFetches();
  while (!conns_.empty()) CloseConnLocked(conns_.begin()->first);
  inbox_.Close();
}

void UcxTransport::CloseGracefully(const std::vector<UcxRemote*>& remotes) {
  const absl::Time deadline = absl::Now() + options_.close_timeout;
  absl::MutexLock lock(&mu_);
  if (worker_ == nullptr) return;
  std::vector<UcxRemote*> closing;
  for (UcxRemote* remote : remotes) {
    if (remote->state != UcxRemote::State::kUp) continue;
    remote->state = UcxRemote::State::kClosing;
    closing.push_back(remote);
    if (remote->ep == nullptr || remote->ep_errored) continue;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::OnFlushDone;
    param.user_data = remote;
    ucs_status_ptr_t request = ucp_ep_flush_nbx(remote->ep, &param);
    if (UCS_PTR_IS_PTR(request)) remote->flush_pending = true;
  }
  if (closing.empty()) return;
  Wake();
  // 1. Everything we sent has arrived.
  auto flushed = [&closing]() {
    for (const UcxRemote* remote : closing) {
      if (remote->flush_pending) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&flushed), deadline);
  // 2. BYE on every socket to each remote; it answers once its endpoint to us is closed.
  for (UcxRemote* remote : closing) {
    for (auto& [fd, conn] : conns_) {
      if (conn->token != remote->token || conn->awaiting_ack) continue;
      if (WriteLivenessFrame(fd, kBye, token_)) {
        conn->awaiting_ack = true;
        ++remote->acks_awaited;
      }
    }
  }
  auto acknowledged = [&closing]() {
    for (const UcxRemote* remote : closing) {
      if (remote->acks_awaited > 0) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&acknowledged), deadline);
  // 3. Close our endpoints; the remotes no longer use theirs.
  for (UcxRemote* remote : closing) {
    CloseEndpointLocked(*remote, /*force=*/remote->ep_errored, /*acknowledge_when_done=*/false);
    CloseConnsOfLocked(remote->token);
    remote->flush_pending = false;
    remote->state = UcxRemote::State::kClosed;
  }
  Wake();
}

void UcxTransport::ProgressLoop() {
  constexpr absl::Duration kMaxWait = absl::Milliseconds(100);
  while (baton_.TakeForProgress()) {
    DriveOnce(absl::Now() + kMaxWait, absl::ZeroDuration());
    baton_.ReleaseFromProgress();
  }
}

bool UcxTransport::TryDrive(absl::Time deadline) {
  if (!baton_.TakeForReceiver(deadline, [this] { Wake(); })) return false;
  DriveOnce(std::min(deadline, absl::Now() + absl::Milliseconds(100)), options_.busy_poll);
  baton_.ReleaseFromReceiver();
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
    const bool busy = !sends_.empty() || receiver_.Fetching() || pending_closes_ > 0;
    timeout_ms = std::min(busy ? 1 : 100, PollTimeoutMillis(until));
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

bool UcxTransport::ProgressLocked() {
  receiver_.ReleaseReturned();
  bool progressed = false;
  while (ucp_worker_progress(worker_) != 0) progressed = true;
  while (!eps_to_force_close_.empty()) {
    std::vector<ucp_ep_h> eps = std::move(eps_to_force_close_);
    eps_to_force_close_.clear();
    for (ucp_ep_h ep : eps) StartEndpointCloseLocked(ep, /*force=*/true, nullptr);
    while (ucp_worker_progress(worker_) != 0) {
    }
    progressed = true;
  }
  return progressed;
}

void UcxTransport::AcceptLocked() {
  for (;;) {
    int fd = AcceptLiveness(listen_fd_);
    if (fd < 0) return;
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
  while (conn->buffer.size() >= kLivenessFrameSize) {
    uint32_t type = 0;
    uint64_t token = 0;
    if (!ParseLivenessFrame(conn->buffer.substr(0, kLivenessFrameSize), &type, &token)) {
      LOG(WARNING) << "UCX transport: garbage on a liveness socket; closing it";
      ConnLostLocked(fd);
      return;
    }
    conn->buffer.erase(0, kLivenessFrameSize);
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
      bool added = false;
      UcxRemote* remote = &peers_.FindOrAdd(token, &added);
      if (added) {
        sockaddr_in sa = {};
        socklen_t len = sizeof(sa);
        getpeername(conn.fd, reinterpret_cast<sockaddr*>(&sa), &len);
        remote->where = Ipv4String(sa.sin_addr.s_addr);
      }
      if (remote->state == UcxRemote::State::kFailed ||
          remote->state == UcxRemote::State::kClosing) {
        CloseConnLocked(conn.fd);
        return;
      }
      // A process that closed gracefully may connect again; our own endpoint to it stays closed
      // until our Connect.
      remote->state = UcxRemote::State::kUp;
      conn.token = token;
      if (!WriteLivenessFrame(conn.fd, kHelloAck, token_)) ConnLostLocked(conn.fd);
      return;
    }
    case kBye: {
      UcxRemote* remote = peers_.Find(conn.token);
      if (remote == nullptr) return;
      if (remote->state == UcxRemote::State::kClosing) {
        WriteLivenessFrame(conn.fd, kByeAck, token_);  // both sides are closing
      } else if (remote->state == UcxRemote::State::kUp) {
        PeerClosingLocked(*remote);
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
  UcxRemote* remote = peers_.Find(token);
  if (token == 0 || remote == nullptr) return;
  if (remote->state == UcxRemote::State::kUp) {
    FailLocked(*remote, "its process exited or was killed (liveness connection lost)");
  }
}

void UcxTransport::CloseConnLocked(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second->awaiting_ack) {
    UcxRemote* remote = peers_.Find(it->second->token);
    if (remote != nullptr) --remote->acks_awaited;
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

void UcxTransport::PeerClosingLocked(UcxRemote& remote) {
  remote.state = UcxRemote::State::kClosed;
  CloseEndpointLocked(remote, /*force=*/remote.ep_errored, /*acknowledge_when_done=*/true);
}

void UcxTransport::AcknowledgeByeLocked(UcxRemote& remote) {
  for (const auto& [fd, conn] : conns_) {
    if (conn->token == remote.token) WriteLivenessFrame(fd, kByeAck, token_);
  }
  CloseConnsOfLocked(remote.token);
}

void UcxTransport::FailLocked(UcxRemote& remote, const std::string& reason) {
  if (remote.state == UcxRemote::State::kFailed) return;
  remote.state = UcxRemote::State::kFailed;
  remote.flush_pending = false;
  inbox_.Fail(remote.token,
              absl::UnavailableError(absl::StrCat(remote.Describe(), " failed: ", reason)));
  if (remote.ep != nullptr) {
    eps_to_force_close_.push_back(remote.ep);
    remote.ep = nullptr;
  }
  CloseConnsOfLocked(remote.token);
}

void UcxTransport::CloseEndpointLocked(UcxRemote& remote, bool force, bool acknowledge_when_done) {
  ucp_ep_h ep = remote.ep;
  remote.ep = nullptr;
  if (ep == nullptr) {
    if (acknowledge_when_done) AcknowledgeByeLocked(remote);
    return;
  }
  if (StartEndpointCloseLocked(ep, force, acknowledge_when_done ? &remote : nullptr)) return;
  if (acknowledge_when_done) AcknowledgeByeLocked(remote);
}

bool UcxTransport::StartEndpointCloseLocked(ucp_ep_h ep, bool force,
                                            UcxRemote* remote_to_acknowledge) {
  auto* op = new CloseOp{this, remote_to_acknowledge};
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
    return true;
  }
  delete op;
  return false;
}

// The callbacks below run inside ucp calls, all of which are made with mu_ held.

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  op->transport->sends_.erase(op);
  ucp_request_free(request);
  if (status != UCS_OK && op->remote->state == UcxRemote::State::kUp) {
    op->transport->FailLocked(*op->remote,
                              absl::StrCat("send failed: ", ucs_status_string(status)));
  }
  delete op;
}

void UcxTransport::OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* remote = static_cast<UcxRemote*>(user_data);
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
  auto* remote = static_cast<UcxRemote*>(arg);
  if (remote->ep != ep) return;  // an endpoint already being closed
  remote->ep_errored = true;
  if (remote->state == UcxRemote::State::kUp) {
    remote->transport->FailLocked(*remote,
                                  absl::StrCat("UCX endpoint error: ", ucs_status_string(status)));
  }
}

}  // namespace k3
