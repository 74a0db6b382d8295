#include "moe/moe_layer_map.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(MoeLayerMapTest, K3TinyIsModelLayerMinusDenseLayers) {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->moe_layer_freq, 1);
  const int dense = config->first_k_dense_replace;
  ASSERT_GE(dense, 1);
  for (int l = dense; l < config->num_hidden_layers; ++l) {
    absl::StatusOr<int> moe = MoeLayerIndex(*config, l);
    ASSERT_TRUE(moe.ok()) << moe.status();
    EXPECT_EQ(*moe, l - dense);
    absl::StatusOr<int> back = ModelLayerOfMoe(*config, *moe);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, l);
  }
  EXPECT_EQ(MoeLayerIndex(*config, dense - 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeLayerIndex(*config, config->num_hidden_layers).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeLayerIndex(*config, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayerOfMoe(*config, config->NumMoeLayers()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayerOfMoe(*config, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every other layer MoE (moe_layer_freq 2): the indices count MoE layers only.
TEST(MoeLayerMapTest, SparseMoeLayersAreCountedInOrder) {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  config->first_k_dense_replace = 1;
  config->moe_layer_freq = 2;
  // MoE layers are 2, 4, 6, 8 of 0..8.
  const int expected_model[] = {2, 4, 6, 8};
  ASSERT_EQ(config->NumMoeLayers(), 4);
  for (int moe = 0; moe < 4; ++moe) {
    absl::StatusOr<int> model = ModelLayerOfMoe(*config, moe);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(*model, expected_model[moe]);
    absl::StatusOr<int> index = MoeLayerIndex(*config, expected_model[moe]);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(*index, moe);
  }
  EXPECT_FALSE(MoeLayerIndex(*config, 3).ok());
}

}  // namespace
}  // namespace k3
