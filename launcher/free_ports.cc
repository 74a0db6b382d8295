#include "launcher/free_ports.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace k3 {
namespace {

std::string Errno(const std::string& what) { return absl::StrCat(what, ": ", strerror(errno)); }

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
}  // namespace

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

}  // namespace k3
