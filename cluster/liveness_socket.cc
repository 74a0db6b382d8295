#include "cluster/liveness_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/ucx_address.h"

namespace k3 {
namespace {

constexpr uint32_t kFrameMagic = 0x564c334b;

std::string Errno(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

void SetKeepalive(int fd) {
  int on = 1, idle = 2, interval = 1, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

}  // namespace

bool WriteLivenessFrame(int fd, uint32_t type, uint64_t token) {
  std::string frame;
  AppendLittleEndian(frame, kFrameMagic, 4);
  AppendLittleEndian(frame, type, 4);
  AppendLittleEndian(frame, token, 8);
  return send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(frame.size());
}

bool ParseLivenessFrame(const std::string& bytes, uint32_t* type, uint64_t* token) {
  LittleEndianReader r(bytes);
  uint64_t magic = 0, t = 0;
  if (!r.Le(4, &magic) || magic != kFrameMagic || !r.Le(4, &t) || !r.Le(8, token)) return false;
  *type = static_cast<uint32_t>(t);
  return true;
}

absl::StatusOr<std::vector<uint32_t>> AdvertisedIpv4s(
    const std::vector<std::string>& advertise_ips) {
  std::vector<uint32_t> ips;
  if (advertise_ips.empty()) {
    ifaddrs* interfaces = nullptr;
    if (getifaddrs(&interfaces) != 0) return absl::InternalError(Errno("getifaddrs"));
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP)) continue;
      ips.push_back(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    }
    freeifaddrs(interfaces);
  } else {
    for (const std::string& text : advertise_ips) {
      in_addr ip = {};
      if (inet_pton(AF_INET, text.c_str(), &ip) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: '", text, "'"));
      }
      ips.push_back(ip.s_addr);
    }
  }
  if (ips.empty()) return absl::UnavailableError("no IPv4 interface is up");
  return ips;
}

absl::StatusOr<LivenessListener> ListenForLiveness() {
  LivenessListener listener;
  listener.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener.fd < 0) return absl::InternalError(Errno("socket"));
  int on = 1;
  setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(listener.fd, 128) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    absl::Status error = absl::InternalError(Errno("liveness listener"));
    close(listener.fd);
    return error;
  }
  listener.port = ntohs(sa.sin_port);
  return listener;
}

int AcceptLiveness(int listen_fd) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) SetKeepalive(fd);
  return fd;
}

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
  if (poll(&p, 1, PollTimeoutMillis(deadline)) != 1) return fail("connect timed out");
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return fail(absl::StrCat("connect: ", strerror(error)));
  if (!WriteLivenessFrame(fd, kHello, our_token)) return fail(Errno("send"));
  std::string reply;
  while (reply.size() < kLivenessFrameSize) {
    p = {fd, POLLIN, 0};
    if (poll(&p, 1, PollTimeoutMillis(deadline)) != 1) return fail("no answer to the handshake");
    char buf[kLivenessFrameSize];
    ssize_t n = recv(fd, buf, kLivenessFrameSize - reply.size(), 0);
    if (n == 0) return fail("connection closed during the handshake");
    if (n < 0 && errno != EAGAIN && errno != EINTR) return fail(Errno("recv"));
    if (n > 0) reply.append(buf, n);
  }
  uint32_t type = 0;
  uint64_t token = 0;
  if (!ParseLivenessFrame(reply, &type, &token) || type != kHelloAck) {
    return fail("not a k3serve transport");
  }
  if (token != expected_token) {
    return fail("a different process listens there now (the address is stale)");
  }
  SetKeepalive(fd);
  return fd;
}

int PollTimeoutMillis(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(deadline - absl::Now() + absl::Microseconds(999))));
}

}  // namespace k3
