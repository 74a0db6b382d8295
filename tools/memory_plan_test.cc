#include "tools/memory_plan.h"

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

namespace k3 {
namespace {

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  return dir;
}

// K3's real dimensions (spec §1.1) as a headers-only release-layout checkpoint in 96 shards.
TEST(MemoryPlanTest, K3HeadersOnlyCheckpointAddsUpAndMatchesTheSpecExpertSize) {
  // The fields config.json must give, at K3's values (ModelConfig's defaults, model/config.h); the
  // rest, the layer lists among them, take K3's defaults.
  const ModelConfig d;
  nlohmann::json text = {{"vocab_size", d.vocab_size},
                         {"hidden_size", d.hidden_size},
                         {"num_hidden_layers", d.num_hidden_layers},
                         {"intermediate_size", d.intermediate_size},
                         {"num_attention_heads", d.num_attention_heads},
                         {"num_key_value_heads", d.num_key_value_heads},
                         {"q_lora_rank", *d.q_lora_rank},
                         {"kv_lora_rank", d.kv_lora_rank},
                         {"qk_nope_head_dim", d.qk_nope_head_dim},
                         {"qk_rope_head_dim", d.qk_rope_head_dim},
                         {"v_head_dim", d.v_head_dim},
                         {"num_experts", d.num_experts},
                         {"num_experts_per_token", d.num_experts_per_token},
                         {"num_shared_experts", d.num_shared_experts},
                         {"moe_intermediate_size", d.moe_intermediate_size},
                         {"linear_attn_config",
                          {{"num_heads", d.linear_attn.num_heads},
                           {"head_dim", d.linear_attn.head_dim},
                           {"short_conv_kernel_size", d.linear_attn.short_conv_kernel_size}}}};
  auto parsed = ParseModelConfig(
      nlohmann::json{{"model_type", "kimi_k3"}, {"text_config", text}}.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig& k3 = *parsed;
  ASSERT_EQ(k3.hidden_size, 7168);
  ASSERT_EQ(k3.NumMoeLayers(), 92);
  const std::string dir = Fresh("k3_headers");
  RandomCheckpointOptions options;
  options.mxfp4 = true;
  options.headers_only = true;
  options.shards = 96;
  ASSERT_TRUE(WriteRandomCheckpoint(k3, 1, dir, options).ok());

  auto plan = PlanMemory(dir, {.attention = 1, .routers = 1, .experts = 8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The checkpoint's size from the layout: BF16 matrices and norms, F32 A_log / dt_bias / score
  // bias, MXFP4 experts at 4.25 bits per weight.
  uint64_t expected = 0;
  for (const TensorSlot& slot : CheckpointLayout(k3)) {
    const bool f32 = slot.init == TensorInit::kALog || slot.init == TensorInit::kDtBias ||
                     slot.init == TensorInit::kScoreBias;
    expected +=
        slot.expert >= 0 ? slot.numel() / 2 + slot.numel() / 32 : slot.numel() * (f32 ? 4 : 2);
  }
  EXPECT_EQ(plan->checkpoint_bytes, expected);
  EXPECT_EQ(plan->unused_bytes, 0u);
  uint64_t sum = plan->attention_bytes + plan->router_bytes;
  for (uint64_t w : plan->expert_worker_bytes) sum += w;
  EXPECT_EQ(sum, plan->checkpoint_bytes);
  EXPECT_EQ(plan->total_mapped, plan->checkpoint_bytes);
  // Spec §10: one expert is 17,547,264 bytes; 896 experts over 8 workers in each of 92 MoE layers.
  constexpr uint64_t kExpertBytes = 17547264;
  for (int w = 0; w < 8; ++w) {
    EXPECT_EQ(plan->expert_worker_bytes[w], 112 * 92 * kExpertBytes) << w;
    EXPECT_EQ(plan->expert_worker_slices[w], std::make_pair(112 * w, 112 * (w + 1)));
  }
  EXPECT_EQ(plan->expert_token_bytes, 16 * 92 * kExpertBytes);
  // The router reads 92 gates [896, 7168] and latent down projections [3584, 7168] in BF16, plus
  // the score biases and latent norms in F32 / BF16.
  EXPECT_EQ(plan->router_token_bytes,
            uint64_t{92} * (896 * 7168 * 2 + 896 * 4 + 3584 * 7168 * 2 + 3584 * 2));
  EXPECT_LT(plan->attention_token_bytes, plan->attention_bytes);
  EXPECT_NE(FormatMemoryPlan(*plan).find("expert 7"), std::string::npos);
  // On GPUs: 137 GiB / (92 x 17,547,264 bytes) = 91.1 expert ids per H200, so 10 H200s for 896
  // (shared/notes/gpu.md's ">= 11" counts 141 GB less the non-expert weights' share: no GPU here
  // holds those).
  EXPECT_EQ(plan->expert_id_bytes, 92 * kExpertBytes);
  EXPECT_EQ(plan->experts_per_gpu, 91);
  EXPECT_EQ(plan->min_gpus, 10);
  EXPECT_NE(FormatMemoryPlan(*plan).find("at least 10 GPUs for 896 experts"), std::string::npos)
      << FormatMemoryPlan(*plan);
  EXPECT_NE(FormatMemoryPlan(*plan).find("does not fit"), std::string::npos);  // 112 per worker
}

// On a real checkpoint the plan agrees with what the loader maps for each expert worker's share.
TEST(MemoryPlanTest, ExpertWorkerBytesAreWhatTheLoaderMaps) {
  auto config = NamedConfig("k3-tiny-8");
  ASSERT_TRUE(config.ok());
  const std::string dir = Fresh("tiny8_mxfp4");
  RandomCheckpointOptions options;
  options.mxfp4 = true;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, 3, dir, options).ok());
  auto plan = PlanMemory(dir, {.attention = 1, .routers = 1, .experts = 3});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::shared_ptr<const Checkpoint> shared = *std::move(checkpoint);
  for (int w = 0; w < 3; ++w) {
    std::vector<int> ids;
    for (int e = plan->expert_worker_slices[w].first; e < plan->expert_worker_slices[w].second;
         ++e) {
      ids.push_back(e);
    }
    auto weights = LoadWeights(shared, WeightSelection::Experts(ids));
    ASSERT_TRUE(weights.ok()) << weights.status();
    EXPECT_EQ(plan->expert_worker_bytes[w], (*weights)->selected_bytes) << w;
  }
  // Replicated tiers count once per process.
  auto replicated = PlanMemory(dir, {.attention = 3, .routers = 2, .experts = 3});
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  EXPECT_EQ(replicated->total_mapped,
            plan->total_mapped + 2 * plan->attention_bytes + plan->router_bytes);
}

TEST(MemoryPlanTest, BadTopologiesAndCheckpointsGiveClearErrors) {
  auto config = NamedConfig("k3-tiny-8");
  ASSERT_TRUE(config.ok());
  const std::string dir = Fresh("tiny8_headers");
  RandomCheckpointOptions options;
  options.headers_only = true;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, 3, dir, options).ok());
  auto too_many = PlanMemory(dir, {.attention = 1, .routers = 1, .experts = 33});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("without any"), std::string::npos)
      << too_many.status();
  EXPECT_FALSE(PlanMemory(dir, {.attention = 0, .routers = 1, .experts = 1}).ok());
  auto missing = PlanMemory(dir + "/nothing", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nothing"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace k3
