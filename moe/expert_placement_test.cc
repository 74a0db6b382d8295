#include "moe/expert_placement.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

using Experts = std::vector<int>;

TEST(ExpertPlacementTest, ContiguousSlicesFollowTheCapacities) {
  // 1, 2 and 3 workers with uneven slices; capacities summing to N are the slice sizes.
  auto one = ContiguousPlacement(2, 6, {6});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->ExpertsOn(0, 1), (Experts{0, 1, 2, 3, 4, 5}));

  auto two = ContiguousPlacement(2, 6, {4, 2});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->ExpertsOn(0, 0), (Experts{0, 1, 2, 3}));
  EXPECT_EQ(two->ExpertsOn(1, 0), (Experts{4, 5}));

  auto three = ContiguousPlacement(3, 6, {1, 2, 3}, 7);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->version, 7);
  EXPECT_EQ(three->num_layers(), 3);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(three->ExpertsOn(0, l), (Experts{0}));
    EXPECT_EQ(three->ExpertsOn(1, l), (Experts{1, 2}));
    EXPECT_EQ(three->ExpertsOn(2, l), (Experts{3, 4, 5}));
  }
  EXPECT_EQ(three->WorkersFor(2, 4), (Experts{2}));
  EXPECT_TRUE(three->Validate().ok());

  // Spare capacity: 7 experts over capacities {2, 3, 5} (10 slots) start at
  // floor(7 · {0, 2, 5} / 10) = {0, 1, 3}.
  auto spare = ContiguousPlacement(1, 7, {2, 3, 5});
  ASSERT_TRUE(spare.ok());
  EXPECT_EQ(spare->ExpertsOn(0, 0), (Experts{0}));
  EXPECT_EQ(spare->ExpertsOn(1, 0), (Experts{1, 2}));
  EXPECT_EQ(spare->ExpertsOn(2, 0), (Experts{3, 4, 5, 6}));
}

TEST(ExpertPlacementTest, ContiguousSlicesFitAndCoverForRandomCapacities) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    int workers = 1 + rng() % 6;
    std::vector<int> capacity(workers);
    int total = 0;
    for (int& c : capacity) total += c = rng() % 9;
    if (total == 0) continue;
    int experts = 1 + rng() % total;
    auto placement = ContiguousPlacement(1, experts, capacity);
    ASSERT_TRUE(placement.ok()) << placement.status();
    ASSERT_TRUE(placement->Validate().ok()) << placement->Validate();
    int next = 0;  // slices are contiguous, in worker order, and cover each expert once
    for (int w = 0; w < workers; ++w) {
      Experts on = placement->ExpertsOn(w, 0);
      EXPECT_LE(static_cast<int>(on.size()), capacity[w]);
      for (int e : on) EXPECT_EQ(e, next++);
    }
    EXPECT_EQ(next, experts);
  }
}

TEST(ExpertPlacementTest, ContiguousRejectsTooFewSlots) {
  EXPECT_FALSE(ContiguousPlacement(1, 6, {2, 3}).ok());
  EXPECT_FALSE(ContiguousPlacement(1, 6, {}).ok());
  EXPECT_FALSE(ContiguousPlacement(1, 2, {3, -1}).ok());
  EXPECT_FALSE(ContiguousPlacement(1, 0, {3}).ok());
}

TEST(ExpertPlacementTest, ReplicasSplitTokensEvenlyByTokenIndex) {
  ExpertPlacement placement;
  placement.num_workers = 4;
  placement.num_experts = 2;
  placement.hosts = {{{1, 3}, {0, 1, 2}}};
  ASSERT_TRUE(placement.Validate().ok());
  std::vector<int> count(4, 0);
  for (int64_t token = 0; token < 600; ++token) ++count[placement.WorkerForToken(0, 1, token)];
  EXPECT_EQ(count, (std::vector<int>{200, 200, 200, 0}));
  EXPECT_EQ(placement.WorkerForToken(0, 0, 0), 1);
  EXPECT_EQ(placement.WorkerForToken(0, 0, 1), 3);
  EXPECT_EQ(placement.WorkerForToken(0, 0, 1000001), 3);
  EXPECT_EQ(placement.ExpertsOn(1, 0), (Experts{0, 1}));
  EXPECT_EQ(placement.ExpertsOn(3, 0), (Experts{0}));
}

TEST(ExpertPlacementTest, RingReplicasLetOneLiveWorkerCoverADeadOne) {
  absl::StatusOr<ExpertPlacement> p = ContiguousPlacement(2, 6, {2, 2, 2});
  ASSERT_TRUE(p.ok()) << p.status();
  AddRingReplicas(&*p, 2);
  ASSERT_TRUE(p->Validate().ok()) << p->Validate();
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(p->ExpertsOn(0, layer), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(p->ExpertsOn(1, layer), (std::vector<int>{2, 3, 4, 5}));
    EXPECT_EQ(p->ExpertsOn(2, layer), (std::vector<int>{0, 1, 4, 5}));
    for (int e = 0; e < 6; ++e) EXPECT_EQ(p->WorkersFor(layer, e).size(), 2u) << e;
  }
  // Fewer spare slots than a share: part of the next worker's experts; none: unchanged.
  absl::StatusOr<ExpertPlacement> q = ContiguousPlacement(1, 6, {3, 3});
  ASSERT_TRUE(q.ok());
  const ExpertPlacement before = *q;
  AddRingReplicas(&*q, 0);
  EXPECT_EQ(*q, before);
  AddRingReplicas(&*q, 1);
  EXPECT_EQ(q->ExpertsOn(0, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(q->ExpertsOn(1, 0), (std::vector<int>{0, 3, 4, 5}));
  // More spare slots than other experts: every worker holds everything once.
  AddRingReplicas(&*q, 100);
  EXPECT_TRUE(q->Validate().ok());
  EXPECT_EQ(q->ExpertsOn(0, 0).size(), 6u);
  EXPECT_EQ(q->ExpertsOn(1, 0).size(), 6u);
}

TEST(ExpertPlacementTest, ValidateNamesWhatIsWrong) {
  ExpertPlacement good;
  good.num_workers = 2;
  good.num_experts = 2;
  good.hosts = {{{0}, {1}}};
  ASSERT_TRUE(good.Validate().ok());

  ExpertPlacement bad = good;
  bad.hosts[0][1] = {};
  EXPECT_NE(bad.Validate().message().find("no worker"), std::string::npos) << bad.Validate();
  bad = good;
  bad.hosts[0][1] = {2};
  EXPECT_NE(bad.Validate().message().find("outside"), std::string::npos) << bad.Validate();
  bad = good;
  bad.hosts[0][0] = {1, 1};
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.hosts[0].pop_back();
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.num_workers = 0;
  EXPECT_FALSE(bad.Validate().ok());
}

}  // namespace
}  // namespace k3
