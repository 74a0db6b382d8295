// A local cluster whose attention worker and expert workers all run on GPU 0 (`k3serve local
// --attention-device cuda:0 --expert-device cuda:0`) generates, greedily, the tokens the whole
// model on that GPU in one process generates (`k3serve generate --device cuda:0`, ProcessEngine):
// the same kernels in the same order, the routed rows crossing the router tier on the host
// (issue 21). Random k3-tiny checkpoint with MXFP4 experts, four prompts, two at once. Without a
// GPU it reports itself skipped. Run from a folder holding the k3serve binary (Bazel's runfiles;
// gpu_check.sh runs it beside the bundle's copy).
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention_nodes/generate_client.h"
#include "engine/process_engine.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "tests/cluster_testing.h"

namespace k3 {

bool have_gpu = false;

namespace {

constexpr int kMaxNewTokens = 12;

TEST(GpuClusterTest, GpuTiersGenerateTheSingleGpuProcessTokens) {
  if (!have_gpu) GTEST_SKIP() << "no GPU";
  const std::string model = RandomCheckpointDir("k3-tiny", 7, /*mxfp4=*/true);
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  const std::vector<std::vector<int32_t>> prompts = TestPrompts(4, config->vocab_size, 13);

  std::vector<std::vector<int32_t>> expected;
  {
    auto engine = OpenProcessEngine(model, ComputeDevice{0});
    ASSERT_TRUE(engine.ok()) << engine.status();
    GenerateOptions options;
    options.sampling.temperature = 0.0f;
    options.max_new_tokens = kMaxNewTokens;
    for (const std::vector<int32_t>& prompt : prompts) {
      auto tokens = (*engine)->Generate(prompt, options);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      expected.push_back(*std::move(tokens));
    }
  }

  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 2, {});
  options.extra_args[NodeRole::kAttention] = {"--device", "cuda:0"};
  options.extra_args[NodeRole::kExpert] = {"--device", "cuda:0"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->generate_addresses().at(0);
  std::vector<absl::StatusOr<GenerateOutcome>> outcomes(prompts.size(),
                                                        absl::UnknownError("not run"));
  for (size_t first = 0; first < prompts.size(); first += 2) {  // two streams batched at once
    std::vector<std::thread> streams;
    for (size_t i = first; i < first + 2 && i < prompts.size(); ++i) {
      streams.emplace_back([&, i] {
        outcomes[i] = GenerateOverGrpc(
            address, GreedyRequest(absl::StrCat("gpu-", i), prompts[i], kMaxNewTokens),
            absl::Seconds(60));
      });
    }
    for (std::thread& t : streams) t.join();
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outcomes[i].ok()) << "prompt " << i << ": " << outcomes[i].status();
    EXPECT_EQ(outcomes[i]->tokens, expected[i]) << "prompt " << i;
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
