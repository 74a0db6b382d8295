// The same request gives the same bits across topologies (issue 39): greedy generation through a
// real multi-process cluster (coordinator, attention, router and expert processes of //:k3serve
// over UCX, each with its own kernel thread count) gives the single-process engine's tokens and,
// bit for bit, its log-probabilities of every token and of its 20 most likely alternatives
// (log_softmax of the full-vocabulary logits: a logits row that differed anywhere would move
// them). The prompts run at once, so the cluster batches them; some are long enough to be cut
// into chunks. One expert worker: with several, each sends the router one partial sum per row
// over its own experts, so a row's experts are added in another grouping than the single
// process's (measured: A2/R2/E3 differs in the last bits; issue 39 leaves this open).
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention_nodes/server/generate_client.h"
#include "attention_nodes/scheduler/sampler.h"
#include "engine/process_engine.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

constexpr int kMaxNewTokens = 8;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

struct Topology {
  const char* name;
  int attention, routers, experts;
};

class ClusterInvarianceTest : public testing::TestWithParam<Topology> {};

TEST_P(ClusterInvarianceTest, LogprobsEqualTheSingleProcessBitForBit) {
  const Topology& topology = GetParam();
  const std::string model = RandomCheckpointDir("k3-tiny", 39);
  std::mt19937 rng(39);
  std::vector<std::vector<int32_t>> prompts;
  for (int length : {1, 7, 40, 150, 333}) {
    std::vector<int32_t> prompt(length);
    for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % 512);
    prompts.push_back(prompt);
  }

  // The single process, one request at a time.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<TokenLogprobs>> logprobs;
  {
    SchedulerOptions options;
    options.prefix_cache_bytes = 0;
    absl::StatusOr<std::unique_ptr<ProcessEngine>> engine =
        ProcessEngine::Open(model, ComputeDevice(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const std::vector<int32_t>& prompt : prompts) {
      GenerationRequest request;
      request.prompt = prompt;
      request.max_new_tokens = kMaxNewTokens;
      request.ignore_eos = true;
      request.top_logprobs = kMaxTopLogprobs;
      logprobs.emplace_back();
      absl::StatusOr<std::vector<int32_t>> generated = (*engine)->Generate(
          request, nullptr, [&](const TokenLogprobs& l) { logprobs.back().push_back(l); });
      ASSERT_TRUE(generated.ok()) << generated.status();
      tokens.push_back(*generated);
    }
  }

  LocalClusterOptions options =
      TestClusterOptions(model, topology.attention, topology.routers, topology.experts);
  // Steps of a few tokens: long prompts are cut, and prefill shares steps with decode.
  for (const char* flag : {"--max-batch-tokens", "48"}) {
    options.extra_args[NodeRole::kAttention].push_back(flag);
  }
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string> addresses = (*cluster)->generate_addresses();
  std::vector<absl::StatusOr<GenerateOutcome>> outcomes(prompts.size(),
                                                        absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request =
          GreedyRequest(absl::StrCat("prompt-", i), prompts[i], kMaxNewTokens);
      request.mutable_sampling()->set_top_logprobs(kMaxTopLogprobs);
      request.mutable_sampling()->set_ignore_eos(true);
      outcomes[i] = GenerateOverGrpc(addresses[i % addresses.size()], request, absl::Seconds(60));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outcomes[i].ok()) << "prompt " << i << ": " << outcomes[i].status();
    const GenerateOutcome& outcome = *outcomes[i];
    EXPECT_EQ(outcome.tokens, tokens[i]) << "prompt " << i;
    ASSERT_EQ(outcome.logprobs.size(), logprobs[i].size()) << "prompt " << i;
    for (size_t t = 0; t < logprobs[i].size(); ++t) {
      const TokenLogprobs& want = logprobs[i][t];
      const v1::TokenLogprobs& got = outcome.logprobs[t];
      EXPECT_TRUE(SameBits(got.logprob(), want.logprob))
          << "prompt " << i << " token " << t << ": " << got.logprob() << " vs " << want.logprob;
      ASSERT_EQ(got.top_size(), static_cast<int>(want.top.size()));
      for (int k = 0; k < got.top_size(); ++k) {
        EXPECT_EQ(got.top(k).token_id(), want.top[k].first) << "prompt " << i << " token " << t;
        EXPECT_TRUE(SameBits(got.top(k).logprob(), want.top[k].second))
            << "prompt " << i << " token " << t << " alternative " << k << ": "
            << got.top(k).logprob() << " vs " << want.top[k].second;
      }
    }
  }
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

INSTANTIATE_TEST_SUITE_P(Topologies, ClusterInvarianceTest,
                         testing::Values(Topology{"a1_r1_e1", 1, 1, 1},
                                         Topology{"a2_r2_e1", 2, 2, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace k3
