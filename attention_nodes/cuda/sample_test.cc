// Token sampling on a GPU (sample.cu) against its CPU twin, attention_nodes/sampler.h's Sampler,
// with the same seeds (sample_cases.h): greedy, the whole vocabulary, top-k, top-p, both, one kept
// token, at k3-tiny's vocabulary and K3's (163,840), planted ties and a NaN row. The picks must be
// equal: both sides compute the probabilities in double and differ only in the order of a sum,
// which could move a pick only if the draw fell within ~1e-15 of a boundary. Without a GPU the GPU
// cases report themselves skipped ("no GPU").
#include "attention_nodes/cuda/sample.h"

#include <vector>

#include "attention_nodes/cuda/sample_cases.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using sample_test::MakeSampleCase;
using sample_test::SampleCase;

void ExpectMatchesCpu(const SamplingOptions& options, int rows, int32_t vocab, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "vocab " << vocab << " temperature " << options.temperature
                                  << " top_k " << options.top_k << " top_p " << options.top_p);
  const SampleCase c = MakeSampleCase(options, rows, vocab, seed, /*tie_at_top=*/seed % 2 == 0,
                                      /*non_finite_row=*/rows - 1);
  DeviceArray<float> logits(c.logits);
  DeviceArray<DeviceSamplingRow> params(c.params);
  DeviceArray<int32_t> tokens(static_cast<size_t>(rows));
  ASSERT_EQ(LaunchSample(logits.get(), c.stride, rows, vocab, params.get(), tokens.get(), nullptr),
            0);
  gpu_test::ExpectDeviceOk();
  EXPECT_EQ(tokens.Download(), c.expected);
}

TEST(SampleGpuTest, MatchesCpuSampler) {
  REQUIRE_GPU();
  uint32_t seed = 1;
  for (const SamplingOptions& options : sample_test::SampleOptionsToCover()) {
    ExpectMatchesCpu(options, 33, 512, seed++);    // k3-tiny's vocabulary
    ExpectMatchesCpu(options, 8, 163840, seed++);  // K3's
  }
}

TEST(SampleGpuTest, RefusesBadShapes) {
  EXPECT_NE(LaunchSample(nullptr, 10, 1, 20, nullptr, nullptr, nullptr), 0);
  EXPECT_NE(LaunchSample(nullptr, 20, 0, 20, nullptr, nullptr, nullptr), 0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
