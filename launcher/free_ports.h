// Ports for a LocalCluster's nodes picked on this host: PickFreePorts draws ports nobody holds
// now, PortHeld tells whether a socket took one since.
//
// Thread-safety: plain functions.
#ifndef K3SERVE_LAUNCHER_FREE_PORTS_H_
#define K3SERVE_LAUNCHER_FREE_PORTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

// `n` distinct ports free on this network namespace's wildcard address right now, drawn at random
// from outside the kernel's ephemeral range where it leaves room (see free_ports.cc).
absl::StatusOr<std::vector<int>> PickFreePorts(int n);

// True when `port` of `host` (an IP address, possibly bracketed) is bound by some socket now.
bool PortHeld(const std::string& host, int port);

}  // namespace k3

#endif  // K3SERVE_LAUNCHER_FREE_PORTS_H_
