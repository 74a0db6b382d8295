#include "moe/cluster_placement.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {

absl::Status ClusterPlacement::Validate() const {
  if (!placed()) {
    if (experts.version < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative placement version ",
                                                     experts.version));
    }
    if (experts.num_workers != 0 || experts.num_experts != 0 || !experts.hosts.empty() ||
        !worker_nodes.empty()) {
      return absl::InvalidArgumentError("a placement with version 0 must be empty");
    }
    return absl::OkStatus();
  }
  K3_RETURN_IF_ERROR(experts.Validate());
  if (worker_nodes.size() != static_cast<size_t>(experts.num_workers)) {
    return absl::InvalidArgumentError(absl::StrCat("placement has ", experts.num_workers,
                                                   " workers but ", worker_nodes.size(),
                                                   " worker node ids"));
  }
  std::set<uint32_t> seen;
  for (uint32_t node : worker_nodes) {
    if (node == 0) return absl::InvalidArgumentError("placement names node id 0 as a worker");
    if (!seen.insert(node).second) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, " acts as two workers"));
    }
  }
  return absl::OkStatus();
}

void ClusterPlacementToProto(const ClusterPlacement& placement,
                             k3serve::cluster::v1::ExpertPlacement* proto) {
  proto->Clear();
  proto->set_version(placement.experts.version);
  proto->set_num_experts(placement.experts.num_experts);
  for (uint32_t node : placement.worker_nodes) proto->add_worker_node_ids(node);
  for (const auto& layer : placement.experts.hosts) {
    k3serve::cluster::v1::LayerPlacement* out = proto->add_layers();
    for (const std::vector<int>& hosts : layer) {
      out->add_experts()->mutable_workers()->Add(hosts.begin(), hosts.end());
    }
  }
}

absl::StatusOr<ClusterPlacement> ClusterPlacementFromProto(
    const k3serve::cluster::v1::ExpertPlacement& proto) {
  ClusterPlacement placement;
  placement.experts.version = proto.version();
  if (proto.version() > 0) {
    placement.experts.num_workers = proto.worker_node_ids_size();
    placement.experts.num_experts = proto.num_experts();
  }
  placement.worker_nodes.assign(proto.worker_node_ids().begin(), proto.worker_node_ids().end());
  for (const auto& layer : proto.layers()) {
    std::vector<std::vector<int>>& out = placement.experts.hosts.emplace_back();
    for (const auto& expert : layer.experts()) {
      out.emplace_back(expert.workers().begin(), expert.workers().end());
    }
  }
  if (absl::Status s = placement.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ExpertPlacement message (version ", proto.version(), "): ",
                     s.message()));
  }
  return placement;
}

absl::StatusOr<ClusterPlacement> ClusterPlacementForModel(
    const k3serve::cluster::v1::ExpertPlacement& proto, int num_experts, int num_moe_layers) {
  K3_ASSIGN_OR_RETURN(ClusterPlacement placement, ClusterPlacementFromProto(proto));
  if (placement.experts.num_experts != num_experts ||
      placement.experts.num_layers() != num_moe_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "it places ", placement.experts.num_experts, " experts in ",
        placement.experts.num_layers(), " MoE layers; the model has ", num_experts, " in ",
        num_moe_layers));
  }
  return placement;
}

}  // namespace k3
