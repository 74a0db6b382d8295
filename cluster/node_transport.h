// The data plane of an attention, router or expert node: UCX set up from the node's flags
// (--busy-poll-us, --ucx-eager-limit), and the order it is taken down in, so the three roles
// cannot drift apart.
#ifndef K3SERVE_CLUSTER_NODE_TRANSPORT_H_
#define K3SERVE_CLUSTER_NODE_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cluster/command_line.h"
#include "cluster/node_runtime.h"
#include "cluster/peer_links.h"
#include "cluster/transport.h"
#include "cluster/ucx_transport.h"

namespace k3 {

// UcxTransportOptions for a node with these flags.
UcxTransportOptions NodeTransportOptions(const NodeFlags& flags);

// UcxTransport::Create with NodeTransportOptions(flags).
absl::StatusOr<std::unique_ptr<UcxTransport>> CreateNodeTransport(const NodeFlags& flags);

// The end of a data-plane node's Shutdown, once its own work is answered and its actor stopped:
// leaves the cluster (peers stop sending here), stops the peer links, closes the transport, then
// stops the endpoints' servers. Null parts (a partial start) are skipped; none is owned.
void StopDataPlane(NodeEndpoints* endpoints, PeerLinks* links, Transport* transport);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NODE_TRANSPORT_H_
