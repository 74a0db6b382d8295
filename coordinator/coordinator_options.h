// CoordinatorOptions: what a coordinator is told at start (its flags), and their consistency.
#ifndef K3SERVE_COORDINATOR_COORDINATOR_OPTIONS_H_
#define K3SERVE_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/device_channel_plan.h"
#include "proto/cluster.pb.h"

namespace k3 {

struct CoordinatorOptions {
  int num_moe_layers = 0;  // layers with routed experts; 0 with num_experts 0: a dense model
  int num_experts = 0;     // routed experts per MoE layer
  int expected_expert_nodes = 1;  // the initial placement waits for this many expert nodes
  std::vector<k3serve::cluster::v1::Role> required_roles = {
      k3serve::cluster::v1::ROLE_ATTENTION, k3serve::cluster::v1::ROLE_ROUTER,
      k3serve::cluster::v1::ROLE_EXPERT};
  // A killed node is DEAD within heartbeat_timeout plus one tick (heartbeat_interval / 2).
  absl::Duration heartbeat_interval = absl::Milliseconds(250);  // told to nodes
  absl::Duration heartbeat_timeout = absl::Milliseconds(1500);
  absl::Duration recovery_window = absl::Milliseconds(1500);
  // Experts per layer each node of the initial placement holds beyond its share, as replicas for
  // failover (the coordinator's --spare-slots-per-worker); 0: no replicas.
  int replica_slots_per_worker = 0;
  // Fresh NCCL unique ids for device channels (cluster/nccl_unique_id.h's NcclUniqueIdSource in
  // production); null: no device channels.
  NcclUniqueIdGenerator nccl_unique_id_generator;

  // INVALID_ARGUMENT naming the field for inconsistent values.
  absl::Status Validate() const;
};

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_OPTIONS_H_
