// Block AttnRes on a GPU (attn_res.cu) against attention_nodes/forward/attn_res.h's AttnResRead: 1,
// 3 and 10 depth sources of random rows at k3-tiny's width (256) and K3's (7168), into a separate
// output and in place over the last source. The projection is scaled so that the scores spread over
// several units (a peaked softmax: a wrong weight shows). Tolerance: both sides in fp32, summing
// the 256-7168-term score sums in different orders (relative error ~1e-6 of each score, which moves
// the weights by about that much): bound 1e-4 of max |cpu|. Without a GPU the GPU cases report
// themselves skipped ("no GPU").
#include "attention_nodes/cuda/attn_res.h"

#include <cmath>
#include <memory>
#include <vector>

#include "attention_nodes/forward/attn_res.h"
#include "kernels/cuda/gpu_test_util.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;

void ExpectMatchesCpu(int n, int rows, int dim, bool in_place, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << n << " sources, " << rows << " x " << dim);
  RandomWeights rnd(seed);
  std::vector<std::vector<float>> sources;
  for (int i = 0; i < n; ++i) sources.push_back(rnd.Normal(rows * dim, 0.0f, 1.0f + 0.3f * i));
  const std::vector<float> proj = rnd.Normal(dim, 0.0f, 2.0f / std::sqrt(static_cast<float>(dim)));
  const std::vector<float> norm = rnd.Normal(dim, 1.0f, 0.1f);
  constexpr float kEps = 1e-5f;
  std::vector<const float*> host_pointers;
  for (const auto& s : sources) host_pointers.push_back(s.data());
  std::vector<float> expected(rows * dim);
  AttnResRead(host_pointers, rows, dim, proj.data(), norm.data(), kEps, expected.data());

  std::vector<std::unique_ptr<DeviceArray<float>>> device_sources;
  std::vector<const float*> device_pointers;
  for (const auto& s : sources) {
    device_sources.push_back(std::make_unique<DeviceArray<float>>(s));
    device_pointers.push_back(device_sources.back()->get());
  }
  DeviceArray<const float*> pointers(device_pointers);
  DeviceArray<float> proj_dev(proj), norm_dev(norm), out(rows * dim);
  float* target = in_place ? device_sources.back()->get() : out.get();
  ASSERT_EQ(LaunchAttnRes(pointers.get(), n, rows, dim, proj_dev.get(), norm_dev.get(), kEps,
                          target, nullptr),
            0);
  gpu_test::ExpectDeviceOk();
  EXPECT_TRUE(AllClose(in_place ? device_sources.back()->Download() : out.Download(), expected,
                       1e-4));
}

TEST(AttnResGpuTest, MatchesCpu) {
  REQUIRE_GPU();
  ExpectMatchesCpu(1, 3, 256, false, 1);
  ExpectMatchesCpu(3, 5, 256, false, 2);
  ExpectMatchesCpu(10, 4, 7168, false, 3);
  ExpectMatchesCpu(10, 4, 7168, true, 4);
}

TEST(AttnResGpuTest, RefusesBadShapes) {
  EXPECT_NE(LaunchAttnRes(nullptr, 0, 1, 16, nullptr, nullptr, 1e-5f, nullptr, nullptr), 0);
  EXPECT_NE(LaunchAttnRes(nullptr, kAttnResMaxSources + 1, 1, 16, nullptr, nullptr, 1e-5f,
                          nullptr, nullptr),
            0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
