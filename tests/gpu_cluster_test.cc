// A local cluster whose attention worker and expert workers all run on GPU 0 (`k3serve local
// --attention-device cuda:0 --expert-device cuda:0`) generates, greedily, the tokens the whole
// model on that GPU in one process generates (`k3serve generate --device cuda:0`, ProcessEngine):
// the same kernels in the same order, the routed rows crossing the router tier on the host
// (issue 21); and the same with the MoE layers going GPU to GPU over device channels. Random
// k3-tiny checkpoint with MXFP4 experts, four prompts, two at once. Without a
// GPU it reports itself skipped. Run from a folder holding the k3serve binary (Bazel's runfiles;
// gpu_check.sh runs it beside the bundle's copy).
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/test_wait.h"
#include "httplib.h"
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

// The greedy tokens of `prompts` from `generate --device cuda:0`.
std::vector<std::vector<int32_t>> SingleProcessTokens(
    const std::string& model, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<int32_t>> expected;
  auto engine = ProcessEngine::Open(model, ComputeDevice{0});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return expected;
  GenerationRequest request;
  request.sampling.temperature = 0.0f;
  request.max_new_tokens = kMaxNewTokens;
  for (const std::vector<int32_t>& prompt : prompts) {
    request.prompt = prompt;
    auto tokens = (*engine)->Generate(request);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    expected.push_back(tokens.ok() ? *std::move(tokens) : std::vector<int32_t>());
  }
  return expected;
}

// A value of the attention worker's /metrics, -1 when absent.
double AttentionMetric(const LocalCluster& cluster, const std::string& name) {
  for (const LocalCluster::Node& node : cluster.nodes()) {
    if (node.name != "attention-0") continue;
    std::vector<std::string> host_port = absl::StrSplit(node.metrics_address, ':');
    if (host_port.size() != 2) return -1;
    httplib::Client client(host_port[0], std::stoi(host_port[1]));
    httplib::Result scraped = client.Get("/metrics");
    if (!scraped || scraped->status != 200) return -1;
    for (absl::string_view line : absl::StrSplit(scraped->body, '\n')) {
      if (absl::ConsumePrefix(&line, name + " ")) return std::stod(std::string(line));
    }
  }
  return -1;
}

// Starts the cluster, generates every prompt greedily (two streams at once) and checks the
// tokens against `expected`; leaves the cluster running for the caller's checks.
std::unique_ptr<LocalCluster> GenerateOnCluster(const LocalClusterOptions& options,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<std::vector<int32_t>>& expected) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return nullptr;
  const std::string address = (*cluster)->generate_addresses().at(0);
  std::vector<absl::StatusOr<GenerateOutcome>> outcomes(prompts.size(),
                                                        absl::UnknownError("not run"));
  for (size_t first = 0; first < prompts.size(); first += 2) {
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
    EXPECT_TRUE(outcomes[i].ok()) << "prompt " << i << ": " << outcomes[i].status();
    if (outcomes[i].ok()) {
      EXPECT_EQ(outcomes[i]->tokens, expected.at(i)) << "prompt " << i;
    }
  }
  return *std::move(cluster);
}

// Four prompts of a random k3-tiny checkpoint with MXFP4 experts, their single-process tokens,
// and the options of a cluster with every worker on GPU 0.
class GpuClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu) GTEST_SKIP() << "no GPU";
    model_ = RandomCheckpointDir("k3-tiny", 7, /*mxfp4=*/true);
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    prompts_ = TestPrompts(4, config->vocab_size, 13);
    expected_ = SingleProcessTokens(model_, prompts_);
    ASSERT_EQ(expected_.size(), prompts_.size());
    options_ = TestClusterOptions(model_, 1, 1, 2, {});
    options_.extra_args[NodeRole::kAttention] = {"--device", "cuda:0"};
    options_.extra_args[NodeRole::kExpert] = {"--device", "cuda:0"};
  }

  std::string model_;
  std::vector<std::vector<int32_t>> prompts_, expected_;
  LocalClusterOptions options_;
};

TEST_F(GpuClusterTest, GpuTiersGenerateTheSingleGpuProcessTokens) {
  std::unique_ptr<LocalCluster> cluster = GenerateOnCluster(options_, prompts_, expected_);
  ASSERT_NE(cluster, nullptr);
  const absl::Status stopped = cluster->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// The same over device channels: each worker its own NCCL host (`--nccl-host-per-node`), so the
// coordinator issues channels between the attention worker and both expert workers although
// they share the GPU, and the MoE layers go GPU to GPU (NCCL's socket transport) without the
// router tier: the attention worker's k3_attention_device_moe_layers_total counts them.
TEST_F(GpuClusterTest, DeviceChannelsGenerateTheSingleGpuProcessTokens) {
  options_.nccl_host_per_node = true;
  options_.metrics = true;
  std::unique_ptr<LocalCluster> cluster = GenerateOnCluster(options_, prompts_, expected_);
  ASSERT_NE(cluster, nullptr);
  // The counters catch up on the worker's 200 ms tick.
  EXPECT_TRUE(WaitFor(
      [&] { return AttentionMetric(*cluster, "k3_attention_device_moe_layers_total") > 0; },
      absl::Seconds(5)));
  EXPECT_EQ(AttentionMetric(*cluster, "k3_attention_device_moe_failures_total"), 0);
  const absl::Status stopped = cluster->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
