// DecodeStepBytesFor and its parts on k3-slice, against spec §12.7's numbers and against the
// matrix shapes counted by hand here (not through the checkpoint layout the code walks).
#include "bench/step_bytes.h"

#include "gtest/gtest.h"
#include "model/config.h"

namespace k3 {
namespace {

ModelConfig Slice() {
  auto config = NamedConfig("k3-slice");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// k3-slice's matrices, shape by shape (spec §2 names, §12.7 widths).
double SliceMatrixParameters() {
  const double d = 7168, vocab = 32768;
  const double outer = 2 * vocab * d;  // embedding and lm_head
  const double dense = 3 * 33792 * d;
  const double kda_width = 96 * 128;
  const double kda = 4 * kda_width * d + d * kda_width + 128 * d + kda_width * 128 + 96 * d;
  const double mla =
      1536 * d + 96 * 192 * 1536 + 576 * d + 96 * 256 * 512.0 + 96 * 128 * d + d * 96 * 128;
  const double moe = 64 * d + 2 * 3584 * d + 3 * 6144 * d;
  return outer + dense + 3 * kda + mla + 3 * moe;
}

TEST(StepBytesTest, NonExpertParametersAreTheSpecs) {
  const ModelConfig config = Slice();
  const double params = static_cast<double>(NonExpertParameters(config));
  // Spec §12.7: ~3.3B BF16 non-expert params, ~6.6 GB.
  EXPECT_NEAR(params, 3.3e9, 0.03 * 3.3e9);
  EXPECT_NEAR(2 * params, 6.6e9, 0.03 * 6.6e9);
  // The matrices, plus norms, biases and conv weights (well under 0.1%).
  EXPECT_GE(params, SliceMatrixParameters());
  EXPECT_LE(params, SliceMatrixParameters() * 1.001);
}

TEST(StepBytesTest, ExpertBytesAreTheSpecs) {
  const ModelConfig config = Slice();
  const double expert = static_cast<double>(Mxfp4ExpertBytes(config));
  // 3 x 3072 x 3584 values at 4.25 bits.
  EXPECT_EQ(expert, 3.0 * 3072 * 3584 * 17 / 32);
  // Spec §12.7: 16 experts x 3 MoE layers are 0.84 GB; all 64 x 3 are 3.4 GB.
  EXPECT_NEAR(16 * 3 * expert, 0.84e9, 0.01e9);
  EXPECT_NEAR(64 * 3 * expert, 3.4e9, 0.05e9);
}

TEST(StepBytesTest, DecodeStepAddsStateAndCache) {
  const ModelConfig config = Slice();
  const double d = 7168, vocab = 32768;
  const DecodeStepBytes one = DecodeStepBytesFor(config, 1, 100, 48);
  EXPECT_DOUBLE_EQ(one.weights,
                   2.0 * (static_cast<double>(NonExpertParameters(config)) - vocab * d) + 2 * d);
  EXPECT_DOUBLE_EQ(one.experts, 48.0 * 3 * 3072 * 3584 * 17 / 32);
  // Three KDA layers: fp32 state 96 x 128 x 128 and conv caches 3 x 3 x 12288, read and written.
  const double kda_per_sequence = 3 * 2 * 4.0 * (96 * 128 * 128 + 3 * 3 * 12288);
  EXPECT_DOUBLE_EQ(one.kda_state, kda_per_sequence);
  // One MLA layer: 576 bf16 values per cached token.
  EXPECT_DOUBLE_EQ(one.mla_cache, 100 * 576 * 2.0);
  EXPECT_DOUBLE_EQ(one.total(), one.weights + one.experts + one.kda_state + one.mla_cache);

  const DecodeStepBytes many = DecodeStepBytesFor(config, 32, 100, 192);
  EXPECT_DOUBLE_EQ(many.weights - one.weights, 31 * 2 * d);
  EXPECT_DOUBLE_EQ(many.kda_state, 32 * kda_per_sequence);
  EXPECT_DOUBLE_EQ(many.mla_cache, 32 * 100 * 576 * 2.0);
  // Batch 1 reads about 6.15 GB of weights (6.6 GB less the 0.47 GB embedding table).
  EXPECT_NEAR(one.weights, 6.15e9, 0.05e9);
}

}  // namespace
}  // namespace k3
