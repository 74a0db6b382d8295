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

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_COORDINATOR_OPTIONS_H_
