#include "coordinator/device_channel_plan.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

// Hands out "id-1", "id-2", ... and counts its calls.
struct CountingGenerator {
  int calls = 0;
  NcclUniqueIdGenerator Get() {
    return [this]() -> absl::StatusOr<std::string> { return absl::StrCat("id-", ++calls); };
  }
};

DeviceChannelMember Member(pb::Role role, uint32_t id, uint64_t incarnation, std::string gpu) {
  return DeviceChannelMember{role, id, incarnation, std::move(gpu)};
}

IssuedDeviceChannel Channel(uint64_t id, uint32_t sender, uint32_t receiver, std::string unique,
                            uint64_t sender_incarnation, uint64_t receiver_incarnation) {
  return IssuedDeviceChannel{
      id, sender, receiver, std::move(unique), sender_incarnation, receiver_incarnation};
}

// Attention node 1 (incarnation 11) on GPU-A, expert node 2 (incarnation 22) on GPU-B.
const std::vector<DeviceChannelMember> kPair = {
    Member(pb::ROLE_ATTENTION, 1, 11, "GPU-A"),
    Member(pb::ROLE_EXPERT, 2, 22, "GPU-B"),
};

TEST(DeviceChannelPlanTest, GpuPairGetsOneChannelEachWay) {
  CountingGenerator gen;
  DeviceChannelPlan plan = PlanDeviceChannels(kPair, {}, {}, 1, gen.Get());
  const std::vector<IssuedDeviceChannel> expected = {Channel(1, 1, 2, "id-1", 11, 22),
                                                     Channel(2, 2, 1, "id-2", 22, 11)};
  EXPECT_EQ(plan.channels, expected);
  EXPECT_EQ(plan.next_id, 3u);
  EXPECT_TRUE(plan.changed);
  EXPECT_TRUE(plan.generator_error.ok());
}

TEST(DeviceChannelPlanTest, SameGpuNoGpuAndOtherRolesGetNone) {
  CountingGenerator gen;
  const std::vector<DeviceChannelMember> alive = {
      Member(pb::ROLE_ATTENTION, 1, 11, "GPU-A"), Member(pb::ROLE_EXPERT, 2, 22, "GPU-A"),
      Member(pb::ROLE_EXPERT, 3, 33, ""),         Member(pb::ROLE_ROUTER, 4, 44, "GPU-C"),
      Member(pb::ROLE_ATTENTION, 5, 55, "GPU-D"),
  };
  // Only 5 <-> 2 qualifies (1 and 2 share GPU-A; 3 has no GPU; routers and attention-attention
  // pairs never do).
  DeviceChannelPlan plan = PlanDeviceChannels(alive, {}, {}, 7, gen.Get());
  const std::vector<IssuedDeviceChannel> expected = {Channel(7, 5, 2, "id-1", 55, 22),
                                                     Channel(8, 2, 5, "id-2", 22, 55)};
  EXPECT_EQ(plan.channels, expected);
}

TEST(DeviceChannelPlanTest, KeptWhileBothEndsLiveOn) {
  CountingGenerator gen;
  const std::vector<IssuedDeviceChannel> current = {Channel(1, 1, 2, "x", 11, 22),
                                                    Channel(2, 2, 1, "y", 22, 11)};
  DeviceChannelPlan plan = PlanDeviceChannels(kPair, current, {}, 3, gen.Get());
  EXPECT_EQ(plan.channels, current);
  EXPECT_FALSE(plan.changed);
  EXPECT_EQ(plan.next_id, 3u);
  EXPECT_EQ(gen.calls, 0);
}

TEST(DeviceChannelPlanTest, RestartedEndGetsNewChannels) {
  CountingGenerator gen;
  const std::vector<IssuedDeviceChannel> current = {Channel(1, 1, 2, "x", 11, 22),
                                                    Channel(2, 2, 1, "y", 22, 11)};
  std::vector<DeviceChannelMember> alive = kPair;
  alive[1].incarnation = 23;  // the expert process restarted under the same id
  DeviceChannelPlan plan = PlanDeviceChannels(alive, current, {}, 3, gen.Get());
  const std::vector<IssuedDeviceChannel> expected = {Channel(3, 1, 2, "id-1", 11, 23),
                                                     Channel(4, 2, 1, "id-2", 23, 11)};
  EXPECT_EQ(plan.channels, expected);
  EXPECT_TRUE(plan.changed);
  EXPECT_EQ(plan.next_id, 5u);
}

TEST(DeviceChannelPlanTest, DeadEndDropsItsChannels) {
  CountingGenerator gen;
  const std::vector<IssuedDeviceChannel> current = {Channel(1, 1, 2, "x", 11, 22),
                                                    Channel(2, 2, 1, "y", 22, 11)};
  DeviceChannelPlan plan = PlanDeviceChannels({kPair[0]}, current, {}, 3, gen.Get());
  EXPECT_TRUE(plan.channels.empty());
  EXPECT_TRUE(plan.changed);
  EXPECT_EQ(plan.next_id, 3u);
  EXPECT_EQ(gen.calls, 0);
}

TEST(DeviceChannelPlanTest, BrokenChannelIsReplacedAlone) {
  CountingGenerator gen;
  const std::vector<IssuedDeviceChannel> current = {Channel(1, 1, 2, "x", 11, 22),
                                                    Channel(2, 2, 1, "y", 22, 11)};
  DeviceChannelPlan plan = PlanDeviceChannels(kPair, current, {1}, 3, gen.Get());
  const std::vector<IssuedDeviceChannel> expected = {Channel(2, 2, 1, "y", 22, 11),
                                                     Channel(3, 1, 2, "id-1", 11, 22)};
  EXPECT_EQ(plan.channels, expected);
  EXPECT_EQ(plan.next_id, 4u);
  // An id no longer issued changes nothing.
  DeviceChannelPlan again = PlanDeviceChannels(kPair, plan.channels, {1}, 4, gen.Get());
  EXPECT_FALSE(again.changed);
}

TEST(DeviceChannelPlanTest, GeneratorErrorSkipsThePairUntilLater) {
  int calls = 0;
  NcclUniqueIdGenerator failing = [&calls]() -> absl::StatusOr<std::string> {
    ++calls;
    return absl::UnavailableError("no NCCL");
  };
  DeviceChannelPlan plan = PlanDeviceChannels(kPair, {}, {}, 1, failing);
  EXPECT_TRUE(plan.channels.empty());
  EXPECT_FALSE(plan.changed);
  EXPECT_EQ(plan.next_id, 1u);
  EXPECT_EQ(plan.generator_error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls, 2);
}

TEST(DeviceChannelPlanTest, NoGeneratorNoChannels) {
  const std::vector<IssuedDeviceChannel> current = {Channel(1, 1, 2, "x", 11, 22)};
  DeviceChannelPlan plan = PlanDeviceChannels(kPair, current, {}, 2, nullptr);
  EXPECT_TRUE(plan.channels.empty());
  EXPECT_TRUE(plan.changed);
}

TEST(DeviceChannelPlanTest, TwoExpertsTwoAttentionNodes) {
  CountingGenerator gen;
  const std::vector<DeviceChannelMember> alive = {
      Member(pb::ROLE_EXPERT, 4, 44, "G4"), Member(pb::ROLE_ATTENTION, 1, 11, "G1"),
      Member(pb::ROLE_EXPERT, 3, 33, "G3"), Member(pb::ROLE_ATTENTION, 2, 22, "G2")};
  DeviceChannelPlan plan = PlanDeviceChannels(alive, {}, {}, 1, gen.Get());
  ASSERT_EQ(plan.channels.size(), 8u);
  const std::vector<std::pair<uint32_t, uint32_t>> ends = {{1, 3}, {3, 1}, {1, 4}, {4, 1},
                                                           {2, 3}, {3, 2}, {2, 4}, {4, 2}};
  for (size_t i = 0; i < ends.size(); ++i) {
    EXPECT_EQ(plan.channels[i].id, i + 1);
    EXPECT_EQ(plan.channels[i].sender, ends[i].first) << i;
    EXPECT_EQ(plan.channels[i].receiver, ends[i].second) << i;
  }
}

}  // namespace
}  // namespace k3
