// GpuEngine (`generate --device cuda:0`) against LocalEngine on the CPU, on a random k3-tiny
// checkpoint with BF16 experts (run on the CPU by both) and with MXFP4 experts (on the GPU's
// expert kernels for GpuEngine, routed on the host and, the default, on the device: gate,
// grouping and latent projections on the GPU): teacher-forced logits over 128 positions, as one
// prefill and as 128 decode steps, and a greedy generation.
//
// Bounds (issue 21): top-1 agreement >= 99% of positions and max |gpu - cpu| <= 2e-2 of max |cpu|
// per position. The GPU rounds the rows entering every product, the MLA cache and the experts'
// rows to bf16 (GpuKdaLayer, GpuMlaLayer and GpuExpertCompute each stay within ~1e-2 on their
// own), and these errors pass through nine layers. A generated token must be the CPU's choice or
// within 2e-2 of it (a near tie that the roundings may flip). Without a GPU the cases report
// themselves skipped ("no GPU").
#include "engine/gpu_engine.h"
#include "engine/process_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/local_engine.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

std::string WriteCheckpoint(bool mxfp4) {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok());
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(base != nullptr ? base : "/tmp") + (mxfp4 ? "/gpu_engine_mxfp4" : "/gpu_engine");
  RandomCheckpointOptions options;
  options.mxfp4 = mxfp4;
  options.linear_std = 0.05f;  // logits spread enough that top-1 is rarely a near tie
  EXPECT_TRUE(WriteRandomCheckpoint(*config, 7, dir, options).ok());
  return dir;
}

// Per position: whether the argmaxes agree, and max |gpu - cpu| / max |cpu|.
void ExpectLogitsClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                       int64_t vocab) {
  ASSERT_EQ(gpu.size(), cpu.size());
  const int64_t positions = static_cast<int64_t>(cpu.size()) / vocab;
  int64_t agree = 0;
  double worst = 0;
  for (int64_t p = 0; p < positions; ++p) {
    const float* g = gpu.data() + p * vocab;
    const float* c = cpu.data() + p * vocab;
    agree += std::max_element(g, g + vocab) - g == std::max_element(c, c + vocab) - c;
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      diff = std::fmax(diff, std::fabs(g[v] - c[v]));
      scale = std::fmax(scale, std::fabs(c[v]));
    }
    worst = std::fmax(worst, diff / scale);
  }
  EXPECT_GE(agree, (positions * 99 + 99) / 100) << agree << " of " << positions;
  EXPECT_LE(worst, 2e-2);
  std::printf("top-1 agreement %lld/%lld, worst relative error %.2e\n",
              static_cast<long long>(agree), static_cast<long long>(positions), worst);
}

void ExpectMatchesCpu(bool mxfp4, GpuRouting routing = GpuRouting::kDevice) {
  const std::string dir = WriteCheckpoint(mxfp4);
  auto cpu = LocalEngine::Open(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = GpuEngine::Open(dir, 0, {}, nullptr, routing);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int64_t vocab = (*cpu)->config().vocab_size;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> tokens(128);
  for (int32_t& t : tokens) t = token(rng);

  auto cpu_logits = (*cpu)->Logits(tokens, /*decode=*/false);
  ASSERT_TRUE(cpu_logits.ok()) << cpu_logits.status();
  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode steps" : "one prefill");
    auto gpu_logits = (*gpu)->Logits(tokens, decode);
    ASSERT_TRUE(gpu_logits.ok()) << gpu_logits.status();
    ExpectLogitsClose(*gpu_logits, *cpu_logits, vocab);
  }

  // Generation: the scheduler over the GPU engine's runner, as `generate --device` runs it.
  GenerationScheduler scheduler((*gpu)->NewStepRunner(), SchedulerOptions(), nullptr);
  GenerationRequest request;
  request.max_new_tokens = 8;
  request.ignore_eos = true;
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 16);
  request.prompt = prompt;
  auto generated = GenerateAndWait(scheduler, request);
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_EQ(generated->size(), 8u);
  std::vector<int32_t> fed = prompt;
  for (int32_t next : *generated) {
    auto logits = (*cpu)->Logits(fed, false);
    ASSERT_TRUE(logits.ok());
    const float* last = logits->data() + (fed.size() - 1) * vocab;
    const float best = *std::max_element(last, last + vocab);
    double scale = 0;
    for (int64_t v = 0; v < vocab; ++v) scale = std::fmax(scale, std::fabs(last[v]));
    EXPECT_LE(best - last[next], 2e-2 * scale) << "token " << next;
    fed.push_back(next);
  }
}

TEST(GpuEngineTest, BF16ExpertsMatchTheCpuEngine) {
  REQUIRE_GPU();
  ExpectMatchesCpu(/*mxfp4=*/false);
}

TEST(GpuEngineTest, Mxfp4ExpertsRoutedOnTheHostMatchTheCpuEngine) {
  REQUIRE_GPU();
  ExpectMatchesCpu(/*mxfp4=*/true, GpuRouting::kHost);
}

TEST(GpuEngineTest, Mxfp4ExpertsRoutedOnTheDeviceMatchTheCpuEngine) {
  REQUIRE_GPU();
  ExpectMatchesCpu(/*mxfp4=*/true, GpuRouting::kDevice);
}

// A decode step replayed from a CUDA graph computes what the same step computes launch by launch:
// the same kernels on the same inputs, but for MLA decode's split of the keys (graphs bound the
// longest length by the page count) and the expert kernels' atomic sums, both fp32 reorderings
// (about 1e-6 of the largest logit; bound 1e-4), so every position's top-1 token is the same.
TEST(GpuEngineTest, CudaGraphReplayGivesTheUncapturedLogits) {
  REQUIRE_GPU();
  const std::string dir = WriteCheckpoint(/*mxfp4=*/true);
  auto plain = GpuEngine::Open(dir, 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto graphed = GpuEngine::Open(dir, 0);
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  ASSERT_TRUE((*graphed)->EnableCudaGraphs().ok());
  const int64_t vocab = (*plain)->config().vocab_size;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> tokens(130);  // past two page boundaries (64 tokens a page)
  for (int32_t& t : tokens) t = token(rng);
  auto want = (*plain)->Logits(tokens, /*decode=*/true);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = (*graphed)->Logits(tokens, /*decode=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  // Per page count: one step runs, one is captured, the rest replay.
  EXPECT_GE((*graphed)->graph_launches(), static_cast<int64_t>(tokens.size()) - 6);
  EXPECT_EQ((*plain)->graph_launches(), 0);
  for (size_t p = 0; p < tokens.size(); ++p) {
    const float* a = want->data() + p * vocab;
    const float* b = got->data() + p * vocab;
    double scale = 0, worst = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      scale = std::fmax(scale, std::fabs(a[v]));
      worst = std::fmax(worst, std::fabs(a[v] - b[v]));
    }
    EXPECT_LE(worst, 1e-4 * scale) << "position " << p;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b)
        << "position " << p;
  }
}

TEST(GpuEngineTest, CudaGraphsNeedDeviceRouting) {
  REQUIRE_GPU();
  auto engine = GpuEngine::Open(WriteCheckpoint(/*mxfp4=*/false), 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->EnableCudaGraphs().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GpuEngineTest, RefusesAMissingDevice) {
  if (have_gpu) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_EQ(GpuEngine::Open("/nonexistent", 0).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
