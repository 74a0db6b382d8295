// PrefixCache on states filled with known values: what a hit restores (pages and snapshot, checked
// value by value against the sequence that stood there), that a hit is only ever a boundary where
// a state was stored, the last-token rule, bad inserts, and the LRU budget.
#include "attention_nodes/scheduler/prefix_cache.h"

#include <random>
#include <vector>

#include "glog/logging.h"
#include "gtest/gtest.h"
#include "model/config.h"

namespace k3 {
namespace {

constexpr int64_t kBlock = 16;

ModelConfig Tiny() {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  CHECK(config.ok()) << config.status();
  return *config;
}

// A state of `length` tokens whose every value is f(seed, position): MLA row t holds
// seed * 1e4 + t + column / 1000, the KDA state holds seed + layer + index / 1e6.
SequenceState FakeState(const ModelConfig& config, int64_t length, int seed) {
  SequenceState state;
  state.kda.resize(config.num_hidden_layers);
  state.mla.resize(config.num_hidden_layers);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.IsKda(l)) {
      state.kda[l] = KdaState(config);
      for (size_t i = 0; i < state.kda[l].s.size(); ++i) state.kda[l].s[i] = seed + l + i * 1e-6f;
      for (float& v : state.kda[l].conv_k) v = static_cast<float>(seed * 10 + l);
    } else {
      MlaCache& cache = state.mla[l];
      cache = MlaCache(config);
      cache.Reserve(length);
      cache.length = length;
      for (int64_t t = 0; t < length; ++t) {
        for (int64_t c = 0; c < cache.width(); ++c) {
          cache.rows[t * cache.width() + c] = seed * 1e4f + t + c / 1000.0f + l;
        }
      }
    }
  }
  state.length = length;
  return state;
}

SequenceState Fresh(const ModelConfig& config) { return FakeState(config, 0, 0); }

std::vector<int32_t> Tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 512);
  return tokens;
}

// `restored` holds `source`'s first `length` MLA rows and its KDA states exactly.
void ExpectHolds(const ModelConfig& config, const SequenceState& restored,
                 const SequenceState& source, int64_t length) {
  ASSERT_EQ(restored.length, length);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.IsKda(l)) {
      EXPECT_EQ(restored.kda[l].s, source.kda[l].s) << "layer " << l;
      EXPECT_EQ(restored.kda[l].conv_k, source.kda[l].conv_k) << "layer " << l;
      continue;
    }
    const MlaCache& got = restored.mla[l];
    ASSERT_EQ(got.length, length) << "layer " << l;
    for (int64_t i = 0; i < length * got.width(); ++i) {
      ASSERT_EQ(got.rows[i], source.mla[l].rows[i]) << "layer " << l << " value " << i;
    }
  }
}

PrefixCacheOptions Options(int64_t budget = int64_t{1} << 30) {
  PrefixCacheOptions options;
  options.block_tokens = kBlock;
  options.budget_bytes = budget;
  return options;
}

TEST(PrefixCacheTest, RestoresTheStateStoredAtTheDeepestMatchingBoundary) {
  const ModelConfig config = Tiny();
  PrefixCache cache(config, Options());
  const std::vector<int32_t> tokens = Tokens(5 * kBlock, 1);
  const SequenceState at2 = FakeState(config, 2 * kBlock, 2);
  const SequenceState at4 = FakeState(config, 4 * kBlock, 4);
  ASSERT_TRUE(cache.Insert(absl::MakeConstSpan(tokens).first(2 * kBlock), at2).ok());
  ASSERT_TRUE(cache.Insert(absl::MakeConstSpan(tokens).first(4 * kBlock), at4).ok());

  // A conversation sharing 3 blocks plus a few tokens: block 3 has MLA rows but no state, so the
  // hit is block 2's state, with block 2's writer's rows (its pages came first).
  std::vector<int32_t> three(tokens.begin(), tokens.begin() + 3 * kBlock + 5);
  SequenceState restored = Fresh(config);
  EXPECT_EQ(cache.Restore(three, &restored), 2 * kBlock);
  ExpectHolds(config, restored, at2, 2 * kBlock);

  // The whole 5 blocks: block 4's state; its first two blocks' rows are at2's (stored once).
  SequenceState deep = Fresh(config);
  EXPECT_EQ(cache.Restore(tokens, &deep), 4 * kBlock);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (config.IsKda(l)) {
      EXPECT_EQ(deep.kda[l].s, at4.kda[l].s);
      continue;
    }
    const int64_t w = deep.mla[l].width();
    EXPECT_EQ(deep.mla[l].rows[0], at2.mla[l].rows[0]);
    EXPECT_EQ(deep.mla[l].rows[3 * kBlock * w], at4.mla[l].rows[3 * kBlock * w]);
  }
  EXPECT_EQ(cache.stats().hits, 2);
  EXPECT_EQ(cache.stats().hit_tokens, 6 * kBlock);
}

TEST(PrefixCacheTest, LeavesTheLastTokenToCompute) {
  const ModelConfig config = Tiny();
  PrefixCache cache(config, Options());
  const std::vector<int32_t> tokens = Tokens(2 * kBlock, 3);
  ASSERT_TRUE(cache.Insert(tokens, FakeState(config, 2 * kBlock, 1)).ok());
  SequenceState state = Fresh(config);
  EXPECT_EQ(cache.Restore(tokens, &state), 0);  // the same tokens: the state at 32 is no hit
  EXPECT_EQ(state.length, 0);
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  EXPECT_EQ(cache.Restore(longer, &state), 2 * kBlock);
}

TEST(PrefixCacheTest, ADifferentTokenInsideABlockMisses) {
  const ModelConfig config = Tiny();
  PrefixCache cache(config, Options());
  std::vector<int32_t> tokens = Tokens(2 * kBlock, 4);
  ASSERT_TRUE(cache.Insert(tokens, FakeState(config, 2 * kBlock, 1)).ok());
  tokens[kBlock + 3] ^= 1;  // the second block differs: no state at 32 for these tokens
  tokens.push_back(1);
  SequenceState state = Fresh(config);
  EXPECT_EQ(cache.Restore(tokens, &state), 0);
  tokens[3] ^= 1;  // and the first block too
  EXPECT_EQ(cache.Restore(tokens, &state), 0);
  EXPECT_EQ(cache.stats().lookups, 2);
  EXPECT_EQ(cache.stats().hits, 0);
}

TEST(PrefixCacheTest, RejectsAStateNotStandingAtTheBoundary) {
  const ModelConfig config = Tiny();
  PrefixCache cache(config, Options());
  const std::vector<int32_t> tokens = Tokens(2 * kBlock, 5);
  EXPECT_EQ(cache.Insert(absl::MakeConstSpan(tokens).first(kBlock + 1),
                         FakeState(config, kBlock + 1, 1))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Insert(tokens, FakeState(config, 3 * kBlock, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Insert({}, Fresh(config)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.stats().nodes, 0);
  PrefixCacheOptions bad = Options();
  bad.block_tokens = 24;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedLeavesToTheBudget) {
  const ModelConfig config = Tiny();
  // Measure one conversation of one block: its page, key and snapshot.
  int64_t one = 0;
  {
    PrefixCache probe(config, Options());
    ASSERT_TRUE(probe.Insert(Tokens(kBlock, 9), FakeState(config, kBlock, 1)).ok());
    one = probe.stats().bytes;
  }
  PrefixCache cache(config, Options(3 * one));
  std::vector<std::vector<int32_t>> conversations;
  for (uint32_t i = 0; i < 3; ++i) {
    conversations.push_back(Tokens(kBlock, 100 + i));
    ASSERT_TRUE(cache.Insert(conversations.back(), FakeState(config, kBlock, i)).ok());
  }
  EXPECT_EQ(cache.stats().evictions, 0);
  // Use the first one again, then add a fourth: the second (least recently used) goes.
  std::vector<int32_t> first = conversations[0];
  first.push_back(0);
  SequenceState state = Fresh(config);
  ASSERT_EQ(cache.Restore(first, &state), kBlock);
  ASSERT_TRUE(cache.Insert(Tokens(kBlock, 200), FakeState(config, kBlock, 7)).ok());
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_LE(cache.stats().bytes, 3 * one);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> query = conversations[i];
    query.push_back(0);
    SequenceState s = Fresh(config);
    EXPECT_EQ(cache.Restore(query, &s), i == 1 ? 0 : kBlock) << "conversation " << i;
  }
}

TEST(PrefixCacheTest, EvictingALeafDropsParentsThatHoldNoState) {
  const ModelConfig config = Tiny();
  PrefixCache cache(config, Options());
  ASSERT_TRUE(cache.Insert(Tokens(3 * kBlock, 11), FakeState(config, 3 * kBlock, 1)).ok());
  EXPECT_EQ(cache.stats().nodes, 3);
  EXPECT_EQ(cache.stats().snapshots, 1);
  PrefixCache small(config, Options(1));  // nothing fits: every insert is evicted whole
  ASSERT_TRUE(small.Insert(Tokens(3 * kBlock, 11), FakeState(config, 3 * kBlock, 1)).ok());
  EXPECT_EQ(small.stats().nodes, 0);
  EXPECT_EQ(small.stats().bytes, 0);
  EXPECT_EQ(small.stats().evictions, 1);
}

}  // namespace
}  // namespace k3
