// The data-plane transport of an attention, router or expert node: UCX set up from the node's
// flags (--busy-poll-us, --ucx-eager-limit), so the three roles cannot drift apart.
#ifndef K3SERVE_CLUSTER_NODE_TRANSPORT_H_
#define K3SERVE_CLUSTER_NODE_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cluster/command_line.h"
#include "cluster/ucx_transport.h"

namespace k3 {

// UcxTransportOptions for a node with these flags.
UcxTransportOptions NodeTransportOptions(const NodeFlags& flags);

// UcxTransport::Create with NodeTransportOptions(flags).
absl::StatusOr<std::unique_ptr<UcxTransport>> CreateNodeTransport(const NodeFlags& flags);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NODE_TRANSPORT_H_
