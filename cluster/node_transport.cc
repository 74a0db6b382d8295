#include "cluster/node_transport.h"

#include "absl/time/time.h"

namespace k3 {

UcxTransportOptions NodeTransportOptions(const NodeFlags& flags) {
  UcxTransportOptions options;
  options.busy_poll = absl::Microseconds(flags.busy_poll_us);
  options.eager_limit = flags.ucx_eager_limit;
  return options;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> CreateNodeTransport(const NodeFlags& flags) {
  return UcxTransport::Create(NodeTransportOptions(flags));
}

void StopDataPlane(NodeEndpoints* endpoints, PeerLinks* links, Transport* transport) {
  if (endpoints != nullptr) endpoints->Leave();
  if (links != nullptr) links->Stop();
  if (transport != nullptr) transport->Close();
  if (endpoints != nullptr) endpoints->Stop();
}

}  // namespace k3
