// CoordinatorState's device channels (coordinator/device_channel_plan.h) as the cluster state
// publishes them.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

const absl::Time kStart = absl::FromUnixSeconds(1700000000);
constexpr absl::Duration kBeat = absl::Milliseconds(250);

// "nccl-1", "nccl-2", ...: each call's id is new.
struct Ids {
  int calls = 0;
};

CoordinatorOptions Options(Ids* ids) {
  CoordinatorOptions options;
  options.num_moe_layers = 1;
  options.num_experts = 4;
  options.expected_expert_nodes = 1;
  options.recovery_window = absl::ZeroDuration();
  if (ids != nullptr) {
    options.nccl_unique_id_generator = [ids]() -> absl::StatusOr<std::string> {
      return absl::StrCat("nccl-", ++ids->calls);
    };
  }
  return options;
}

pb::NodeInfo Node(pb::Role role, uint64_t incarnation, const std::string& gpu) {
  pb::NodeInfo info;
  info.set_role(role);
  info.set_grpc_address(absl::StrCat("10.0.0.1:", 6000 + incarnation));
  info.set_expert_slots(role == pb::ROLE_EXPERT ? 4 : 0);
  info.set_incarnation(incarnation);
  info.set_gpu_uuid(gpu);
  return info;
}

uint32_t Join(CoordinatorState& c, const pb::NodeInfo& info, absl::Time now) {
  pb::RegisterRequest request;
  *request.mutable_node() = info;
  absl::StatusOr<pb::RegisterResponse> response = c.Register(request, now);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? response->node_id() : 0;
}

// (id, sender, receiver, unique id) of each published channel.
struct Published {
  uint64_t id;
  uint32_t sender;
  uint32_t receiver;
  std::string unique_id;
  bool operator==(const Published&) const = default;
};

std::vector<Published> ChannelsOf(const pb::ClusterState& state) {
  std::vector<Published> out;
  for (const pb::DeviceChannel& c : state.device_channels()) {
    out.push_back({c.id(), c.sender(), c.receiver(), c.nccl_unique_id()});
  }
  return out;
}

// Attention node on GPU-A, router without a GPU, expert node on `expert_gpu`.
struct Cluster {
  explicit Cluster(const std::string& expert_gpu, bool with_nccl = true)
      : c(Options(with_nccl ? &ids : nullptr), kStart) {
    infos.push_back(Node(pb::ROLE_ATTENTION, 101, "GPU-A"));
    infos.push_back(Node(pb::ROLE_ROUTER, 102, ""));
    infos.push_back(Node(pb::ROLE_EXPERT, 103, expert_gpu));
    for (pb::NodeInfo& info : infos) info.set_node_id(Join(c, info, kStart));
    now = kStart;
  }
  // Heartbeats and ticks for `d`; the nodes in `silent` send nothing.
  void Run(absl::Duration d, const std::set<uint32_t>& silent = {}) {
    for (absl::Time end = now + d; now < end;) {
      now += kBeat / 2;
      c.Tick(now);
      now += kBeat / 2;
      for (const pb::NodeInfo& info : infos) {
        if (silent.count(info.node_id()) == 0) {
          c.Heartbeat(info.node_id(), info.incarnation(), {}, now);
        }
      }
      c.Tick(now);
    }
  }
  uint32_t id(int i) const { return infos[i].node_id(); }

  Ids ids;
  CoordinatorState c;
  std::vector<pb::NodeInfo> infos;
  absl::Time now;
};

TEST(CoordinatorDeviceChannelsTest, GpuAttentionAndExpertGetOneChannelEachWay) {
  Cluster cl("GPU-B");
  const uint32_t attention = cl.id(0), expert = cl.id(2);
  const std::vector<Published> expected = {{1, attention, expert, "nccl-1"},
                                           {2, expert, attention, "nccl-2"}};
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
  // Steady heartbeats change nothing.
  const uint64_t members = cl.c.members_version();
  cl.Run(absl::Seconds(1));
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
  EXPECT_EQ(cl.c.members_version(), members);
  EXPECT_EQ(cl.ids.calls, 2);
}

TEST(CoordinatorDeviceChannelsTest, NodesSharingAGpuGetNone) {
  Cluster cl("GPU-A");
  EXPECT_TRUE(cl.c.State().device_channels().empty());
  EXPECT_EQ(cl.ids.calls, 0);
}

TEST(CoordinatorDeviceChannelsTest, WithoutNcclThereAreNone) {
  Cluster cl("GPU-B", /*with_nccl=*/false);
  EXPECT_TRUE(cl.c.State().device_channels().empty());
}

TEST(CoordinatorDeviceChannelsTest, ADeadExpertsChannelsGoAndItsRestartGetsNewOnes) {
  Cluster cl("GPU-B");
  const uint32_t attention = cl.id(0), expert = cl.id(2);
  cl.Run(absl::Seconds(2), {expert});
  ASSERT_EQ(cl.c.State().members(2).state(), pb::DEAD);
  EXPECT_TRUE(cl.c.State().device_channels().empty());

  // A new process takes the dead node's id: new channels, new ids, new NCCL unique ids.
  const uint64_t members = cl.c.members_version();
  pb::NodeInfo restarted = Node(pb::ROLE_EXPERT, 203, "GPU-B");
  restarted.set_node_id(expert);
  ASSERT_EQ(Join(cl.c, restarted, cl.now), expert);
  cl.infos[2] = restarted;
  const std::vector<Published> expected = {{3, attention, expert, "nccl-3"},
                                           {4, expert, attention, "nccl-4"}};
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
  EXPECT_GT(cl.c.members_version(), members);
}

TEST(CoordinatorDeviceChannelsTest, ARestartBeforeTheDeathIsNoticedReplacesTheChannels) {
  Cluster cl("GPU-B");
  const uint32_t attention = cl.id(0), expert = cl.id(2);
  // The attention process restarts and registers anew (its old self is not yet DEAD).
  pb::NodeInfo restarted = Node(pb::ROLE_ATTENTION, 301, "GPU-A");
  const uint32_t fresh = Join(cl.c, restarted, cl.now);
  const std::vector<Published> expected = {{1, attention, expert, "nccl-1"},
                                           {2, expert, attention, "nccl-2"},
                                           {3, fresh, expert, "nccl-3"},
                                           {4, expert, fresh, "nccl-4"}};
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
  cl.infos.push_back(restarted);
  cl.infos[3].set_node_id(fresh);
  cl.Run(absl::Seconds(2), {attention});
  const std::vector<Published> after = {{3, fresh, expert, "nccl-3"}, {4, expert, fresh, "nccl-4"}};
  EXPECT_EQ(ChannelsOf(cl.c.State()), after);
}

TEST(CoordinatorDeviceChannelsTest, ABrokenReportReissuesTheChannel) {
  Cluster cl("GPU-B");
  const uint32_t attention = cl.id(0), router = cl.id(1), expert = cl.id(2);
  const uint64_t members = cl.c.members_version();
  // A node that is not an end of channel 1 cannot break it.
  HeartbeatReply reply = cl.c.Heartbeat(router, cl.infos[1].incarnation(), {}, cl.now, 0, {1});
  EXPECT_EQ(reply.members_version, members);
  EXPECT_EQ(cl.c.State().device_channels_size(), 2);

  reply = cl.c.Heartbeat(expert, cl.infos[2].incarnation(), {}, cl.now, 0, {1});
  EXPECT_GT(reply.members_version, members);  // so the nodes fetch the new state
  const std::vector<Published> expected = {{2, expert, attention, "nccl-2"},
                                           {3, attention, expert, "nccl-3"}};
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
  // The other end's report of the same, already replaced channel changes nothing.
  reply = cl.c.Heartbeat(attention, cl.infos[0].incarnation(), {}, cl.now, 0, {1});
  EXPECT_EQ(ChannelsOf(cl.c.State()), expected);
}

}  // namespace
}  // namespace k3
