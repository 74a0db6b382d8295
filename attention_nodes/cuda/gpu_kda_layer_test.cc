// GpuKdaLayer (gpu_kda_layer.cc: cuBLAS projections, the fused decode kernel, the recurrent
// prefill, o_proj) against the CPU layer, attention_nodes/forward/kda.cc, on random BF16 weights
// (spec §12.3 style, as kda_decode_test.cc): a batch of sequences with warm states (histories of
// different lengths) decoding two tokens, then one sequence prefilling a chunk, at k3-tiny's
// widths, with Kimi Linear's gates, and at k3-slice's (96 heads of 128).
//
// Tolerance: the GPU rounds each product's rows to bf16 (x, the low-rank factors' outputs and
// the kernel's output before o_proj; the CPU keeps fp32), 2^-9 relative per element, which moves
// the layer output and the state by ~1e-3 of their largest values: bound 2e-2 of max |cpu|
// (kda_decode_test.cc checks the kernel alone to 1e-4). Without a GPU the GPU cases report
// themselves skipped ("no GPU").
#include "attention_nodes/cuda/gpu_kda_layer.h"

#include <cmath>
#include <vector>

#include "attention_nodes/forward/kda.h"
#include "attention_nodes/cuda/kda_test_inputs.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/config.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;
using kda_test::MakeWeights;
using kda_test::Named;
using kda_test::SliceWidths;

constexpr double kBound = 2e-2;

void ExpectStatesClose(GpuKdaLayer& layer, int32_t slot, const KdaState& want) {
  KdaState got;
  ASSERT_TRUE(layer.DownloadState(slot, &got).ok());
  EXPECT_TRUE(AllClose(got.s, want.s, kBound));
  EXPECT_TRUE(AllClose(got.conv_v, want.conv_v, kBound));
}

void ExpectMatchesCpu(const ModelConfig& config, int batch, uint32_t seed) {
  RandomWeights rnd(seed);
  const KdaWeights w = MakeWeights(config, &rnd);
  const int64_t d = config.hidden_size;
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  auto layer = GpuKdaLayer::Create(config, w, batch + 2, products->get());
  ASSERT_TRUE(layer.ok()) << layer.status();

  // Histories of 1, 4, 7, ... tokens on the CPU; sequence b in slot batch - b (slot 0 unused).
  std::vector<KdaState> states(batch, KdaState(config));
  std::vector<int32_t> slot_of(batch);
  Scratch scratch;
  for (int b = 0; b < batch; ++b) {
    const std::vector<float> prompt = rnd.Normal((1 + 3 * b) * d, 0.0f, 1.0f);
    std::vector<float> out(prompt.size());
    ASSERT_TRUE(
        KdaForwardBatch(config, w, prompt.data(), {{&states[b], 1 + 3 * b}}, out.data(), &scratch)
            .ok());
    slot_of[b] = batch - b;
    ASSERT_TRUE((*layer)->UploadState(slot_of[b], states[b]).ok());
  }
  DeviceArray<int32_t> slots(slot_of);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(testing::Message() << "decode step " << step);
    const std::vector<float> x = rnd.Normal(batch * d, 0.0f, 1.0f);
    std::vector<KdaSegment> segments;
    for (KdaState& state : states) segments.push_back(KdaSegment{&state, 1});
    std::vector<float> cpu_out(batch * d);
    ASSERT_TRUE(KdaForwardBatch(config, w, x.data(), segments, cpu_out.data(), &scratch).ok());
    DeviceArray<float> x_dev(x), out(batch * d);
    ASSERT_TRUE((*layer)->Decode(x_dev.get(), batch, slots.get(), out.get()).ok());
    gpu_test::ExpectDeviceOk();
    EXPECT_TRUE(AllClose(out.Download(), cpu_out, kBound));
  }
  for (int b = 0; b < batch; ++b) ExpectStatesClose(**layer, slot_of[b], states[b]);

  // A prefill chunk for the first sequence, continuing its state.
  constexpr int kChunk = 37;
  const std::vector<float> x = rnd.Normal(kChunk * d, 0.0f, 1.0f);
  std::vector<float> cpu_out(kChunk * d);
  ASSERT_TRUE(
      KdaForwardBatch(config, w, x.data(), {{&states[0], kChunk}}, cpu_out.data(), &scratch).ok());
  DeviceArray<float> x_dev(x), out(kChunk * d);
  DeviceArray<int32_t> slot(std::vector<int32_t>{slot_of[0]});
  ASSERT_TRUE((*layer)->Prefill(x_dev.get(), kChunk, slot.get(), out.get()).ok());
  gpu_test::ExpectDeviceOk();
  EXPECT_TRUE(AllClose(out.Download(), cpu_out, kBound));
  ExpectStatesClose(**layer, slot_of[0], states[0]);
}

TEST(GpuKdaLayerTest, MatchesCpuAtK3TinyWidths) {
  REQUIRE_GPU();
  ExpectMatchesCpu(Named("k3-tiny"), 3, 1);
}

TEST(GpuKdaLayerTest, MatchesCpuWithKimiLinearGates) {
  REQUIRE_GPU();
  ExpectMatchesCpu(Named("kimi-linear-tiny"), 3, 2);
}

TEST(GpuKdaLayerTest, MatchesCpuAtK3SliceWidths) {
  REQUIRE_GPU();
  ExpectMatchesCpu(SliceWidths(), 4, 3);
}

TEST(GpuKdaLayerTest, RefusesWhatItCannotRun) {
  REQUIRE_GPU();  // the products' cuBLAS handle needs a device
  ModelConfig config = Named("k3-tiny");
  RandomWeights rnd(4);
  KdaWeights w = MakeWeights(config, &rnd);
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok());
  w.q_proj = rnd.Matrix(w.q_proj.rows, w.q_proj.cols, 0.05f, WeightType::kF32);
  EXPECT_EQ(GpuKdaLayer::Create(config, w, 2, products->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.linear_attn.head_dim = 48;
  EXPECT_EQ(GpuKdaLayer::Create(config, w, 2, products->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
