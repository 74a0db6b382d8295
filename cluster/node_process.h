// What the node processes of every tier share besides the data plane: stopping on SIGINT /
// SIGTERM, the addresses they advertise, and their memory footprint.
#ifndef K3SERVE_CLUSTER_NODE_PROCESS_H_
#define K3SERVE_CLUSTER_NODE_PROCESS_H_

#include <signal.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace k3 {

// Blocks SIGINT and SIGTERM for the process while it lives, so that a node's main loop sees them
// by polling between its short waits instead of dying mid-step. Construct it before starting any
// thread: threads inherit the mask. Thread-compatible.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();  // restores the previous mask
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The pending SIGINT or SIGTERM (consumed), else 0. Never blocks.
  int Poll();

 private:
  sigset_t signals_;
  sigset_t previous_;
};

// "host:port", with brackets for an IPv6 host.
std::string HostPort(const std::string& host, int port);

// The host other processes reach this one by: `bind_host`, or this machine's host name when
// `bind_host` is a wildcard ("", "0.0.0.0", "::").
std::string AdvertisedHost(const std::string& bind_host);

// The process's resident set size in bytes (/proc/self/statm).
absl::StatusOr<int64_t> ResidentBytes();

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NODE_PROCESS_H_
