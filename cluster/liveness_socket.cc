#include "cluster/liveness_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cluster/ucx_address.h"

namespace k3 {
namespace {

constexpr uint32_t kLivenessFrameMagic = 0x564c334b;

}  // namespace

std::string ErrnoMessage(const char* what) { return absl::StrCat(what, ": ", strerror(errno)); }

void SetLivenessKeepalive(int fd) {
  int on = 1, idle = 2, interval = 1, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

bool WriteLivenessFrame(int fd, uint32_t type, uint64_t token) {
  std::string frame;
  AppendLittleEndian(frame, kLivenessFrameMagic, 4);
  AppendLittleEndian(frame, type, 4);
  AppendLittleEndian(frame, token, 8);
  return send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(frame.size());
}

bool ParseLivenessFrame(const std::string& bytes, uint32_t* type, uint64_t* token) {
  LittleEndianReader r(bytes);
  uint64_t magic = 0, t = 0;
  if (!r.Le(4, &magic) || magic != kLivenessFrameMagic || !r.Le(4, &t) || !r.Le(8, token)) return false;
  *type = static_cast<uint32_t>(t);
  return true;
}

int PollMillisUntil(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(deadline - absl::Now() + absl::Microseconds(999))));
}

absl::StatusOr<int> DialLiveness(uint32_t ip, uint16_t port, uint64_t our_token,
                                 uint64_t expected_token, absl::Time deadline) {
  const std::string where = absl::StrCat(Ipv4String(ip), ":", port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(ErrnoMessage("socket"));
  auto fail = [&](const std::string& why) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot reach ", where, ": ", why));
  };
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = ip;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    return fail(ErrnoMessage("connect"));
  }
  pollfd p = {fd, POLLOUT, 0};
  if (poll(&p, 1, PollMillisUntil(deadline)) != 1) return fail("connect timed out");
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return fail(absl::StrCat("connect: ", strerror(error)));
  if (!WriteLivenessFrame(fd, kHello, our_token)) return fail(ErrnoMessage("send"));
  std::string reply;
  while (reply.size() < kLivenessFrameSize) {
    p = {fd, POLLIN, 0};
    if (poll(&p, 1, PollMillisUntil(deadline)) != 1) return fail("no answer to the handshake");
    char buf[kLivenessFrameSize];
    ssize_t n = recv(fd, buf, kLivenessFrameSize - reply.size(), 0);
    if (n == 0) return fail("connection closed during the handshake");
    if (n < 0 && errno != EAGAIN && errno != EINTR) return fail(ErrnoMessage("recv"));
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
  SetLivenessKeepalive(fd);
  return fd;
}

}  // namespace k3
