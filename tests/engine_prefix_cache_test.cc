// The prefix cache changes no result: 50 random multi-turn conversations on a random k3-tiny
// checkpoint, each turn generated greedily by the single-process engine (the GenerationScheduler)
// with the prefix cache and by one without it; every token is the same, and so are the
// log-probabilities of each token and of its 20 most likely alternatives, within 1e-4 (log_softmax
// moves by at most twice the largest logit difference; measured: 3.3e-6). The conversations' turns add 1 to 40 tokens (so shared prefixes end inside a
// block and inside a KDA chunk), some conversations branch off others mid-block, and the cache's
// budget is small enough that it evicts while they run.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "engine/process_engine.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;

constexpr double kLogprobTolerance = 1e-4;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

struct Turn {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
};

Turn RunTurn(ProcessEngine& engine, const std::vector<int32_t>& prompt, int max_new_tokens) {
  Turn turn;
  GenerationRequest request;
  request.prompt = prompt;
  request.max_new_tokens = max_new_tokens;
  request.ignore_eos = true;
  request.top_logprobs = kMaxTopLogprobs;
  absl::StatusOr<std::vector<int32_t>> generated = engine.Generate(
      request, nullptr, [&](const TokenLogprobs& logprobs) { turn.logprobs.push_back(logprobs); });
  EXPECT_TRUE(generated.ok()) << generated.status();
  if (generated.ok()) turn.tokens = *generated;
  return turn;
}

// The largest difference between two tokens' log-probabilities and their alternatives' (by rank:
// near-ties may swap ids).
double LogprobDifference(const TokenLogprobs& a, const TokenLogprobs& b) {
  double worst = std::fabs(static_cast<double>(a.logprob) - b.logprob);
  EXPECT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < std::min(a.top.size(), b.top.size()); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a.top[i].second) - b.top[i].second));
  }
  return worst;
}

TEST(EnginePrefixCacheTest, ConversationsMatchWithoutTheCache) {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  const std::string dir = TempDir("engine_prefix_cache");
  ASSERT_TRUE(WriteRandomModelFolder(*config, 41, dir, 1).ok());
  SchedulerOptions with_cache;
  with_cache.prefix_block_tokens = 16;
  with_cache.prefix_cache_bytes = 4 << 20;  // ~30 snapshots of k3-tiny: the 50 conversations evict
  SchedulerOptions without_cache;
  without_cache.prefix_cache_bytes = 0;
  absl::StatusOr<std::unique_ptr<ProcessEngine>> cached =
      ProcessEngine::Open(dir, ComputeDevice(), with_cache);
  absl::StatusOr<std::unique_ptr<ProcessEngine>> plain =
      ProcessEngine::Open(dir, ComputeDevice(), without_cache);
  ASSERT_TRUE(cached.ok() && plain.ok());

  std::mt19937 rng(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = uniform(0, static_cast<int>(config->vocab_size) - 1);
    return t;
  };
  std::vector<std::vector<int32_t>> histories;  // each conversation's last prompt + answer
  double worst = 0;
  int turns = 0;
  for (int c = 0; c < 50; ++c) {
    std::vector<int32_t> history;
    if (c > 0 && uniform(0, 2) == 0) {
      // Branch off a recent conversation (likely still cached) somewhere inside it, mostly
      // mid-block and past blocks that hold pages but no state.
      const std::vector<int32_t>& from = histories[uniform(std::max(0, c - 3), c - 1)];
      history.assign(from.begin(), from.begin() + uniform(1, static_cast<int>(from.size())));
    }
    const int num_turns = uniform(2, 4);
    for (int t = 0; t < num_turns; ++t) {
      std::vector<int32_t> added = random_tokens(uniform(1, 40));
      history.insert(history.end(), added.begin(), added.end());
      const int max_new = uniform(1, 20);
      const Turn with = RunTurn(**cached, history, max_new);
      const Turn without = RunTurn(**plain, history, max_new);
      ASSERT_EQ(with.tokens, without.tokens) << "conversation " << c << " turn " << t;
      ASSERT_EQ(with.logprobs.size(), without.logprobs.size());
      ASSERT_EQ(with.logprobs.size(), with.tokens.size());
      for (size_t i = 0; i < with.logprobs.size(); ++i) {
        const double diff = LogprobDifference(with.logprobs[i], without.logprobs[i]);
        worst = std::max(worst, diff);
        ASSERT_LE(diff, kLogprobTolerance)
            << "conversation " << c << " turn " << t << " token " << i;
      }
      history.insert(history.end(), with.tokens.begin(), with.tokens.end());
      ++turns;
    }
    histories.push_back(history);
  }
  const PrefixCacheStats stats = (*cached)->scheduler().prefix_cache_stats();
  std::cerr << turns << " turns; worst log-probability difference " << worst << "; hits "
            << stats.hits << "/" << stats.lookups << ", restored " << stats.hit_tokens << " of "
            << stats.lookup_tokens << " tokens, evictions " << stats.evictions << ", held "
            << stats.bytes << " bytes\n";
  // The comparison means something only if the cache was used, and evicted on the way.
  EXPECT_GT(stats.hits, 40);
  EXPECT_GT(stats.hit_tokens, stats.lookup_tokens / 3);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_LE(stats.bytes, with_cache.prefix_cache_bytes);
}

}  // namespace
}  // namespace k3
