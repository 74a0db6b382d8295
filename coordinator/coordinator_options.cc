#include "coordinator/coordinator_options.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

absl::Status CoordinatorOptions::Validate() const {
  if (num_experts < 0 || num_moe_layers < 0) {
    return absl::InvalidArgumentError("num_experts and num_moe_layers must not be negative");
  }
  if ((num_experts == 0) != (num_moe_layers == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_experts (", num_experts, ") and num_moe_layers (", num_moe_layers,
        ") must be both zero (dense model) or both positive"));
  }
  if (replica_slots_per_worker < 0) {
    return absl::InvalidArgumentError("replica_slots_per_worker must not be negative");
  }
  if (num_experts > 0 && expected_expert_nodes < 1) {
    return absl::InvalidArgumentError("expected_expert_nodes must be at least 1 with experts");
  }
  std::set<pb::Role> roles;
  for (pb::Role role : required_roles) {
    if (role != pb::ROLE_ATTENTION && role != pb::ROLE_ROUTER && role != pb::ROLE_EXPERT) {
      return absl::InvalidArgumentError(
          absl::StrCat("required role ", pb::Role_Name(role), " is not a node role"));
    }
    if (!roles.insert(role).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("required role ", pb::Role_Name(role), " listed twice"));
    }
  }
  if (num_experts == 0 && roles.count(pb::ROLE_EXPERT) > 0) {
    return absl::InvalidArgumentError("ROLE_EXPERT is required but the model has no experts");
  }
  if (heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be positive");
  }
  if (heartbeat_timeout <= heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", absl::FormatDuration(heartbeat_timeout),
        ") must exceed heartbeat_interval (", absl::FormatDuration(heartbeat_interval), ")"));
  }
  if (recovery_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("recovery_window must not be negative");
  }
  return absl::OkStatus();
}

}  // namespace k3
