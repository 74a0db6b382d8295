// Greedy generation through real multi-process clusters (coordinator, attention, router and expert
// processes of //:k3serve talking over UCX) must produce exactly the tokens the single-process
// engine produces, for both model families, several topologies, MXFP4 routed experts and concurrent streams, also as
// `k3serve generate --server` prints them.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "attention_nodes/server/generate_client.h"
#include "launcher/local_cluster.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;
namespace v1 = k3serve::v1;

constexpr int kMaxNewTokens = 10;

struct Topology {
  const char* name;
  int attention;
  int routers;
  int experts;
  // Expert slots in sixteenths of the model's experts; empty: the launcher's even split.
  std::vector<int> sixteenths;
};

struct Case {
  const char* config;
  Topology topology;
  bool mxfp4 = false;  // routed experts in the release's MXFP4 layout
};

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  std::string config = info.param.config;
  for (char& c : config) {
    if (c == '-') c = '_';
  }
  return absl::StrCat(config, info.param.mxfp4 ? "_mxfp4_" : "_", info.param.topology.name);
}

class ClusterGenerateTest : public testing::TestWithParam<Case> {};

TEST_P(ClusterGenerateTest, GreedyTokensEqualTheSingleProcessEngine) {
  const Case& c = GetParam();
  const std::string model = RandomCheckpointDir(c.config, 7, c.mxfp4);
  absl::StatusOr<ModelConfig> config = NamedConfig(c.config);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::vector<std::vector<int32_t>> prompts = TestPrompts(4, config->vocab_size, 11);
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, prompts, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();

  std::vector<int> slots;
  for (int s : c.topology.sixteenths) slots.push_back(s * config->num_experts / 16);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(TestClusterOptions(
      model, c.topology.attention, c.topology.routers, c.topology.experts, slots));
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // Every expert node hosts a contiguous slice as large as the slots it was started with
  // (uneven slots sum to the expert count, so the slices are exactly the slots).
  absl::StatusOr<pb::ClusterState> state = (*cluster)->GetClusterState(absl::Seconds(2));
  ASSERT_TRUE(state.ok()) << state.status();
  std::map<uint32_t, int> declared_slots;
  for (const pb::Member& m : state->members()) {
    if (m.node().role() == pb::ROLE_EXPERT)
      declared_slots[m.node().node_id()] = m.node().expert_slots();
  }
  ASSERT_EQ(state->placement().worker_node_ids_size(), c.topology.experts);
  if (!slots.empty()) {
    std::vector<int> hosted(c.topology.experts, 0);
    for (const pb::ExpertReplicas& replicas : state->placement().layers(0).experts()) {
      for (int w : replicas.workers()) ++hosted[w];
    }
    for (int w = 0; w < c.topology.experts; ++w) {
      EXPECT_EQ(hosted[w], declared_slots[state->placement().worker_node_ids(w)]) << "worker " << w;
    }
  }

  const std::vector<std::string> addresses = (*cluster)->generate_addresses();
  ASSERT_EQ(static_cast<int>(addresses.size()), c.topology.attention);
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
        addresses[i % addresses.size()],
        GreedyRequest(absl::StrCat("prompt-", i), prompts[i], kMaxNewTokens), absl::Seconds(30));
    ASSERT_TRUE(outcome.ok()) << "prompt " << i << ": " << outcome.status();
    EXPECT_EQ(outcome->tokens, (*expected)[i]) << "prompt " << i;
    EXPECT_EQ(outcome->complete.finish_reason(), v1::Complete::LENGTH) << "prompt " << i;
    EXPECT_EQ(outcome->complete.usage().prompt_tokens(), static_cast<int>(prompts[i].size()));
    EXPECT_EQ(outcome->complete.usage().generated_tokens(), kMaxNewTokens);
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

INSTANTIATE_TEST_SUITE_P(Topologies, ClusterGenerateTest,
                         testing::Values(Case{"k3-tiny", {"a1_r1_e1", 1, 1, 1, {}}},
                                         Case{"k3-tiny", {"a2_r2_e2", 2, 2, 2, {}}},
                                         Case{"k3-tiny", {"a1_r2_e3_uneven", 1, 2, 3, {3, 5, 8}}},
                                         Case{"k3-tiny",
                                              {"a1_r2_e3_uneven", 1, 2, 3, {3, 5, 8}},
                                              /*mxfp4=*/true},
                                         Case{"k3-tiny-8",
                                              {"a2_r1_e2", 2, 1, 2, {}},
                                              /*mxfp4=*/true},
                                         Case{"kimi-linear-tiny", {"a1_r1_e1", 1, 1, 1, {}}},
                                         Case{"kimi-linear-tiny", {"a2_r2_e2", 2, 2, 2, {}}},
                                         Case{"kimi-linear-tiny",
                                              {"a1_r2_e3_uneven", 1, 2, 3, {3, 5, 8}}}),
                         CaseName);

// Eight streams at once are batched together by the attention node, whose steps run as two
// ping-pong micro-batches (two MoE layers in flight at the router); each stream must still get
// the tokens it gets alone.
TEST(ClusterConcurrencyTest, EightConcurrentStreamsMatchOneAtATime) {
  const std::string model = RandomCheckpointDir("k3-tiny", 7);
  const std::vector<std::vector<int32_t>> prompts = TestPrompts(8, 512, 23);
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, prompts, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 2);
  options.extra_args[NodeRole::kAttention].push_back("--ping-pong=on");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->generate_addresses()[0];

  std::vector<std::vector<int32_t>> one_at_a_time;
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
        address, GreedyRequest(absl::StrCat("alone-", i), prompts[i], kMaxNewTokens),
        absl::Seconds(30));
    ASSERT_TRUE(outcome.ok()) << "prompt " << i << ": " << outcome.status();
    one_at_a_time.push_back(outcome->tokens);
  }
  EXPECT_EQ(one_at_a_time, *expected);

  std::vector<absl::StatusOr<GenerateOutcome>> together(prompts.size(),
                                                        absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      together[i] = GenerateOverGrpc(
          address, GreedyRequest(absl::StrCat("together-", i), prompts[i], kMaxNewTokens),
          absl::Seconds(30));
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(together[i].ok()) << "stream " << i << ": " << together[i].status();
    EXPECT_EQ(together[i]->tokens, one_at_a_time[i]) << "stream " << i;
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// `k3serve generate --server` prints each token as it arrives: the first shows up long before the
// call's deadline, and when the deadline cuts a stream that could not finish, the tokens already
// made stay printed (the single-process engine's first tokens) and the error follows on stderr.
TEST(GenerateCommandTest, ServerModePrintsTokensAsTheyStreamAndKeepsThemOnTimeout) {
  constexpr int kTimeoutMs = 3000;
  constexpr int kTokensToCompare = 32;
  const std::string model = RandomCheckpointDir("k3-tiny", 7);
  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 1);
  options.extra_args[NodeRole::kAttention] = {"--max-new-tokens-limit", "1000000"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  const std::string stderr_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/generate.stderr");
  const std::string command = absl::StrCat(
      std::filesystem::absolute("k3serve").string(), " generate --server ",
      (*cluster)->generate_addresses()[0], " --tokens 5,9,2,6 --max-new-tokens 1000000",
      " --timeout-ms ", kTimeoutMs, " 2>", stderr_path);
  const absl::Time start = absl::Now();
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  int c = std::fgetc(out);
  const absl::Duration first_output = absl::Now() - start;
  for (; c != EOF; c = std::fgetc(out)) text.push_back(static_cast<char>(c));
  const int status = pclose(out);
  std::ifstream file(stderr_path);
  const std::string errors((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());

  EXPECT_LT(first_output, absl::Milliseconds(kTimeoutMs)) << "nothing printed before the deadline";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << errors;
  EXPECT_TRUE(absl::StrContains(errors, "DEADLINE_EXCEEDED")) << errors;
  absl::string_view line = text;
  ASSERT_TRUE(absl::ConsumeSuffix(&line, "\n")) << text;
  std::vector<int32_t> tokens;
  for (absl::string_view word : absl::StrSplit(line, ' ')) {
    int32_t token = 0;
    ASSERT_TRUE(absl::SimpleAtoi(word, &token)) << "'" << word << "' in: " << text.substr(0, 200);
    tokens.push_back(token);
  }
  ASSERT_FALSE(tokens.empty());
  tokens.resize(std::min<size_t>(tokens.size(), kTokensToCompare));
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, {{5, 9, 2, 6}}, static_cast<int>(tokens.size()));
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(tokens, (*expected)[0]);
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace k3
