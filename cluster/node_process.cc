#include "cluster/node_process.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace k3 {

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
}

StopSignals::~StopSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

int StopSignals::Poll() {
  const timespec zero = {0, 0};
  const int signal_number = sigtimedwait(&signals_, nullptr, &zero);
  return signal_number > 0 ? signal_number : 0;
}

std::string HostPort(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

std::string AdvertisedHost(const std::string& bind_host) {
  if (!bind_host.empty() && bind_host != "0.0.0.0" && bind_host != "::") return bind_host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

absl::StatusOr<int64_t> ResidentBytes() {
  FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return absl::UnavailableError("cannot open /proc/self/statm");
  long long size = 0;
  long long resident = 0;
  const int read = std::fscanf(file, "%lld %lld", &size, &resident);
  std::fclose(file);
  if (read != 2) return absl::UnavailableError("cannot parse /proc/self/statm");
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

}  // namespace k3
