#include "http_front/prefix_affinity.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

std::vector<int32_t> Iota(int n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixAffinityTest, NextTurnFindsTheWorkerOfItsLongestRecordedPrefix) {
  PrefixAffinity affinity(4, 100);
  std::vector<int32_t> turn1 = Iota(10, 0);  // blocks [0..4) [4..8), 2 tokens left over
  affinity.Record(turn1, 2);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), {50, 51, 52, 53, 54});
  auto hit = affinity.Lookup(turn2);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->first, 2);
  EXPECT_EQ(hit->second, 8);
  // Another conversation sharing the first block only was served by worker 0: turn2 still
  // prefers worker 2 (a longer prefix), a prompt sharing one block goes to the latest.
  std::vector<int32_t> other = Iota(4, 0);
  other.insert(other.end(), {90, 91, 92, 93});
  affinity.Record(other, 0);
  EXPECT_EQ(affinity.Lookup(turn2)->first, 2);
  std::vector<int32_t> one_block = Iota(4, 0);
  one_block.push_back(7);
  EXPECT_EQ(affinity.Lookup(one_block)->first, 0);
  EXPECT_EQ(affinity.Lookup(one_block)->second, 4);
}

TEST(PrefixAffinityTest, NoWholeSharedBlockNoHint) {
  PrefixAffinity affinity(4, 100);
  affinity.Record(Iota(8, 0), 1);
  EXPECT_FALSE(affinity.Lookup(Iota(3, 0)).has_value());  // shorter than a block
  std::vector<int32_t> differs = Iota(8, 0);
  differs[2] = 99;  // differs inside the first block: the chained hashes all differ
  EXPECT_FALSE(affinity.Lookup(differs).has_value());
}

TEST(PrefixAffinityTest, ForgetsALostWorkerAndStaysWithinCapacity) {
  PrefixAffinity affinity(2, 3);
  affinity.Record(Iota(4, 0), 1);    // 2 hashes
  affinity.Record(Iota(4, 100), 2);  // 2 more: the oldest (prefix [0,1]) is dropped
  EXPECT_EQ(affinity.size(), 3u);
  std::vector<int32_t> first = Iota(4, 0);
  EXPECT_EQ(affinity.Lookup(first)->second, 4);  // [0..4) itself is still there
  affinity.Forget(2);
  EXPECT_EQ(affinity.size(), 1u);
  EXPECT_FALSE(affinity.Lookup(Iota(4, 100)).has_value());
  EXPECT_EQ(affinity.Lookup(first)->first, 1);
}

}  // namespace
}  // namespace k3
