#include "moe/cluster_placement.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Two layers of 6 experts over nodes 11 and 12, as the coordinator would publish them.
k3serve::cluster::v1::ExpertPlacement TwoLayersOfSix() {
  absl::StatusOr<ExpertPlacement> experts = ContiguousPlacement(2, 6, {3, 3}, /*version=*/4);
  EXPECT_TRUE(experts.ok()) << experts.status();
  ClusterPlacement placement{*experts, {11, 12}};
  k3serve::cluster::v1::ExpertPlacement proto;
  ClusterPlacementToProto(placement, &proto);
  return proto;
}

TEST(ClusterPlacementTest, ForModelTakesAPlacementOfItsExpertsAndLayers) {
  absl::StatusOr<ClusterPlacement> placement = ClusterPlacementForModel(TwoLayersOfSix(), 6, 2);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->version(), 4);
  EXPECT_EQ(placement->worker_nodes, (std::vector<uint32_t>{11, 12}));
  EXPECT_EQ(placement->experts.ExpertsOn(1, 1), (std::vector<int>{3, 4, 5}));
}

TEST(ClusterPlacementTest, ForModelRefusesOtherExpertsOrLayers) {
  for (const auto& [experts, layers] : {std::pair{8, 2}, std::pair{6, 3}}) {
    absl::StatusOr<ClusterPlacement> placement =
        ClusterPlacementForModel(TwoLayersOfSix(), experts, layers);
    EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(placement.status().message().find("it places 6 experts in 2 MoE layers"),
              std::string::npos)
        << placement.status();
  }
}

TEST(ClusterPlacementTest, ForModelPassesOnAMalformedMessage) {
  k3serve::cluster::v1::ExpertPlacement proto = TwoLayersOfSix();
  proto.add_worker_node_ids(11);  // a node twice, and more workers than the layers use
  EXPECT_EQ(ClusterPlacementForModel(proto, 6, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
