#include "http_front/client_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace k3 {
namespace {

// The address and port of `address`, as httplib writes them into a Request.
bool Address(const sockaddr_storage& address, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    *port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    *port = ntohs(v6.sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

bool Matches(int fd, const httplib::Request& request) {
  sockaddr_storage local = {}, peer = {};
  socklen_t local_size = sizeof(local), peer_size = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) {
    return false;  // not a connected socket
  }
  std::string local_host, peer_host;
  int local_port = -1, peer_port = -1;
  return Address(local, &local_host, &local_port) && Address(peer, &peer_host, &peer_port) &&
         local_port == request.local_port && peer_port == request.remote_port &&
         peer_host == request.remote_addr && local_host == request.local_addr;
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& request) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return;
  while (const dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (entry->d_name[0] == '.' || fd == dirfd(fds)) continue;
    if (Matches(fd, request)) {
      fd_ = fd;
      break;
    }
  }
  closedir(fds);
}

bool ClientConnection::Gone() const {
  if (fd_ < 0) return false;
  pollfd poll_fd = {fd_, POLLRDHUP, 0};
  return poll(&poll_fd, 1, 0) > 0 && (poll_fd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace k3
