// An expert worker's memory on an MXFP4 checkpoint is its experts' packed bytes: the weights are
// views of the mapping, never unpacked (spec §10; issue 9).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cluster/node_process.h"
#include "expert_nodes/expert_compute.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/glu_params.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

namespace k3 {
namespace {

// Scratch, allocator arenas, kernel-pool thread stacks.
constexpr double kFixedOverheadBytes = 16 << 20;

// Loading every expert and running each once grows the resident set by the experts' codes +
// scales (within 10% plus the fixed overhead), far below the 2 bytes per weight of a BF16 copy.
TEST(ExpertMemoryTest, ResidentSetGrowsByThePackedBytes) {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny-8");
  ASSERT_TRUE(config.ok()) << config.status();
  // Experts large enough (94 MB packed) to stand out from the process's own noise.
  config->moe_intermediate_size = 512;
  config->routed_expert_hidden_size = 512;
  const std::string dir = ::testing::TempDir() + "/expert_memory";
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  RandomCheckpointOptions options;
  options.mxfp4 = true;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, 5, dir, options).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

  const int width = config->ExpertWidth();
  std::vector<float> z(config->num_experts * width, 0.5f), out(z.size());
  std::vector<ExpertAssignment> assignments;
  for (int e = 0; e < config->num_experts; ++e) assignments.push_back({e, e, 1.0f});
  ExpertScratch scratch;
  // Warm the kernel pool and the scratch on expert 0 of a throwaway mapping, then measure.
  {
    absl::StatusOr<std::unique_ptr<Checkpoint>> other = Checkpoint::Open(dir);
    ASSERT_TRUE(other.ok()) << other.status();
    absl::StatusOr<std::unique_ptr<ModelWeights>> warm = LoadWeights(
        std::shared_ptr<const Checkpoint>(*std::move(other)), WeightSelection::Experts({0}));
    ASSERT_TRUE(warm.ok()) << warm.status();
    const std::vector<ExpertAssignment> first = {{0, 0, 1.0f}};
    ASSERT_TRUE(RunExperts((*warm)->layers[1].moe.experts, GluParamsFor(*config), z.data(), 1,
                           width, first, out.data(), &scratch)
                    .ok());
  }
  absl::StatusOr<int64_t> before = ResidentBytes();
  ASSERT_TRUE(before.ok()) << before.status();
  std::vector<int> all(config->num_experts);
  for (int e = 0; e < config->num_experts; ++e) all[e] = e;
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(
      std::shared_ptr<const Checkpoint>(*std::move(checkpoint)), WeightSelection::Experts(all));
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const LayerWeights& layer : (*weights)->layers) {
    if (!layer.is_moe) continue;
    ASSERT_EQ(layer.moe.experts[0].gate.type, WeightType::kMxfp4);
    ASSERT_TRUE(RunExperts(layer.moe.experts, GluParamsFor(*config), z.data(), config->num_experts,
                           width, assignments, out.data(), &scratch)
                    .ok());
  }
  absl::StatusOr<int64_t> after = ResidentBytes();
  ASSERT_TRUE(after.ok()) << after.status();
  const double grown = static_cast<double>(*after - *before);
  const double packed = static_cast<double>((*weights)->selected_bytes);
  std::cerr << "resident set grew " << grown / 1048576 << " MiB for " << packed / 1048576
            << " MiB of packed experts\n";
  EXPECT_GE(grown, 0.9 * packed);  // the experts were really read
  EXPECT_LE(grown, 1.1 * packed + kFixedOverheadBytes);
}

}  // namespace
}  // namespace k3
