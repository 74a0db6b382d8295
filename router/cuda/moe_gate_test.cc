// The MoE gate on a GPU (moe_gate.cu) against its CPU twin, router/gate.cc (sigmoid from
// kernels/activation.h, then SelectExperts), at K3's width (896 experts, top 16, with the score
// bias) and at k3-tiny's, on random logits. Tolerance: the GPU's expf and the CPU's may differ in
// the last bit, so scores agree to 2 fp32 ulps (bound 1e-6 relative) and weights, a ratio of
// 16-term sums of them, to 1e-6; where the two pick different experts for a slot, the choices
// (s + bias) of the two must be within 1e-6 of each other (a tie within rounding). Without a GPU
// the GPU cases report themselves skipped ("no GPU").
#include "kernels/cuda/moe_gate.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cuda/gpu_test_util.h"
#include "router/gate.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;

void ExpectMatchesCpu(int tokens, int num_experts, int top_k, bool with_bias, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << tokens << " tokens, " << num_experts << " experts, top "
                                  << top_k);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(tokens) * num_experts), bias(num_experts);
  for (float& x : logits) x = normal(rng);
  for (float& b : bias) b = 0.1f * normal(rng);
  constexpr float kScaling = 2.5f;

  std::vector<float> cpu_scores(logits.size());
  std::vector<int32_t> cpu_ids(static_cast<size_t>(tokens) * top_k);
  std::vector<float> cpu_weights(cpu_ids.size());
  for (size_t i = 0; i < logits.size(); ++i) cpu_scores[i] = Sigmoid(logits[i]);
  for (int t = 0; t < tokens; ++t) {
    SelectExperts(cpu_scores.data() + t * num_experts, with_bias ? bias.data() : nullptr,
                  num_experts, top_k, /*renormalize=*/true, kScaling, cpu_ids.data() + t * top_k,
                  cpu_weights.data() + t * top_k);
  }

  DeviceArray<float> logits_dev(logits), bias_dev(bias), scores_dev(logits.size()),
      weights_dev(cpu_weights.size());
  DeviceArray<int32_t> ids_dev(cpu_ids.size());
  MoeGateArgs args;
  args.logits = logits_dev.get();
  args.logits_stride = num_experts;
  args.bias = with_bias ? bias_dev.get() : nullptr;
  args.tokens = tokens;
  args.num_experts = num_experts;
  args.top_k = top_k;
  args.scaling = kScaling;
  args.scores = scores_dev.get();
  args.ids = ids_dev.get();
  args.weights = weights_dev.get();
  ASSERT_EQ(LaunchMoeGate(args, nullptr), 0);
  gpu_test::ExpectDeviceOk();
  const std::vector<float> scores = scores_dev.Download(), weights = weights_dev.Download();
  const std::vector<int32_t> ids = ids_dev.Download();

  for (size_t i = 0; i < scores.size(); ++i) {
    ASSERT_NEAR(scores[i], cpu_scores[i], 1e-6f * cpu_scores[i]) << i;
  }
  auto choice = [&](int t, int e) {
    return cpu_scores[t * num_experts + e] + (with_bias ? bias[e] : 0.0f);
  };
  for (int t = 0; t < tokens; ++t) {
    for (int s = 0; s < top_k; ++s) {
      const size_t i = static_cast<size_t>(t) * top_k + s;
      if (ids[i] != cpu_ids[i]) {
        ASSERT_GE(ids[i], 0);
        ASSERT_LT(ids[i], num_experts);
        EXPECT_NEAR(choice(t, ids[i]), choice(t, cpu_ids[i]), 1e-6f)
            << "token " << t << " slot " << s << ": " << ids[i] << " vs " << cpu_ids[i];
        continue;
      }
      EXPECT_NEAR(weights[i], cpu_weights[i], 1e-6f * std::fabs(cpu_weights[i]))
          << "token " << t << " slot " << s;
    }
  }
}

TEST(MoeGateGpuTest, MatchesCpu) {
  REQUIRE_GPU();
  ExpectMatchesCpu(64, 896, 16, true, 1);  // K3
  ExpectMatchesCpu(5, 896, 16, false, 2);
  ExpectMatchesCpu(33, 8, 2, true, 3);     // k3-tiny
  ExpectMatchesCpu(3, 1024, 32, true, 4);  // the largest one launch takes
}

TEST(MoeGateGpuTest, RefusesBadShapes) {
  MoeGateArgs args;
  args.tokens = 1;
  args.num_experts = 8;
  args.logits_stride = 8;
  args.top_k = 9;  // more than the experts
  EXPECT_NE(LaunchMoeGate(args, nullptr), 0);
  args.top_k = 2;
  args.logits_stride = 7;
  EXPECT_NE(LaunchMoeGate(args, nullptr), 0);
  args.logits_stride = 2000;
  args.num_experts = kMoeGateMaxExperts + 1;
  EXPECT_NE(LaunchMoeGate(args, nullptr), 0);
  args.num_experts = 8;
  args.tokens = 0;
  EXPECT_NE(LaunchMoeGate(args, nullptr), 0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
