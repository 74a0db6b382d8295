#include "cluster/device_channels.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

// Records Abort in a flag that outlives it; Send/Recv fail after it, as the NCCL channel does.
class FakeChannel : public DeviceChannel {
 public:
  explicit FakeChannel(std::shared_ptr<std::atomic<bool>> aborted) : aborted_(std::move(aborted)) {}
  absl::Status Send(const void*, size_t) override { return Check(); }
  absl::Status Recv(void*, size_t) override { return Check(); }
  void Abort() override { *aborted_ = true; }
  absl::Status Check() const {
    return *aborted_ ? absl::FailedPreconditionError("aborted") : absl::OkStatus();
  }
  bool aborted() const { return *aborted_; }

 private:
  std::shared_ptr<std::atomic<bool>> aborted_;
};

// An opener whose calls the test lets through one id at a time (or all at once).
class FakeOpener {
 public:
  DeviceChannels::Opener Get() {
    return [this](const DeviceChannelSpec& spec,
                  bool as_sender) -> absl::StatusOr<std::unique_ptr<DeviceChannel>> {
      absl::MutexLock lock(&mu_);
      calls_.push_back({spec.id, as_sender});
      auto released = [this, id = spec.id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return release_all_ || released_.count(id) > 0;
      };
      mu_.Await(absl::Condition(&released));
      auto failure = failures_.find(spec.id);
      if (failure != failures_.end()) return failure->second;
      auto flag = std::make_shared<std::atomic<bool>>(false);
      aborted_[spec.id] = flag;
      auto channel = std::make_unique<FakeChannel>(flag);
      opened_[spec.id] = channel.get();
      return channel;
    };
  }
  void Release(uint64_t id) {
    absl::MutexLock lock(&mu_);
    released_[id] = true;
  }
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    release_all_ = true;
  }
  void FailWith(uint64_t id, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_[id] = std::move(status);
  }
  std::vector<std::pair<uint64_t, bool>> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Whether the channel opened for `id` was aborted (false: not opened yet or not aborted).
  bool aborted(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = aborted_.find(id);
    return it != aborted_.end() && *it->second;
  }
  // The fake the opener made for `id`, for identity checks only (DeviceChannels owns it and may
  // have destroyed it).
  const DeviceChannel* opened(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(id);
    return it == opened_.end() ? nullptr : it->second;
  }

 private:
  absl::Mutex mu_;
  bool release_all_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, bool> released_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, bool>> calls_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, const DeviceChannel*> opened_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> aborted_ ABSL_GUARDED_BY(mu_);
};

pb::ClusterState StateWith(const std::vector<DeviceChannelSpec>& channels) {
  pb::ClusterState state;
  for (const DeviceChannelSpec& spec : channels) {
    pb::DeviceChannel* c = state.add_device_channels();
    c->set_id(spec.id);
    c->set_sender(spec.sender);
    c->set_receiver(spec.receiver);
    c->set_nccl_unique_id(spec.nccl_unique_id);
  }
  return state;
}

// Node 1 (attention) and node 2 (expert), channels 1 (1 -> 2) and 2 (2 -> 1).
const std::vector<DeviceChannelSpec> kPair = {{1, 1, 2, "u1"}, {2, 2, 1, "u2"}};

// After two opener calls (kPair's), applies kPair plus a marker channel 3 (node 1 -> node 5) and
// waits for its call: the opener thread takes channels in order, so a reopening of channel 1 or 2
// asked for by an earlier Apply would come before it. REQUIRES: the opener releases channel 3.
void ExpectOnlyMarkerOpenedNext(FakeOpener& opener, DeviceChannels& channels) {
  std::vector<DeviceChannelSpec> with_marker = kPair;
  with_marker.push_back({3, 1, 5, "u3"});
  channels.Apply(StateWith(with_marker), 1);
  ASSERT_TRUE(WaitFor([&] { return opener.calls().size() >= 3; }));
  ASSERT_TRUE(WaitFor([&] { return channels.ToPeer(5) != nullptr; }));
  EXPECT_EQ(opener.calls().size(), 3u);
  EXPECT_EQ(opener.calls()[2].first, 3u);
}

TEST(DeviceChannelsTest, ApplyReturnsWhileOpeningAndChannelsAppearWhenOpened) {
  FakeOpener opener;
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), /*self_node=*/1);  // returns although the opener blocks
  ASSERT_TRUE(WaitFor([&] { return opener.calls().size() == 1; }));
  EXPECT_EQ(channels.ToPeer(2), nullptr);
  EXPECT_EQ(channels.FromPeer(2), nullptr);

  opener.Release(1);
  ASSERT_TRUE(WaitFor([&] { return channels.ToPeer(2) != nullptr; }));
  EXPECT_EQ(channels.FromPeer(2), nullptr);  // channel 2 is still opening
  opener.Release(2);
  ASSERT_TRUE(WaitFor([&] { return channels.FromPeer(2) != nullptr; }));

  // Node 1 sends on channel 1 and receives on channel 2, opened lowest id first.
  const std::vector<std::pair<uint64_t, bool>> expected = {{1, true}, {2, false}};
  EXPECT_EQ(opener.calls(), expected);
  EXPECT_EQ(channels.ToPeer(2).get(), opener.opened(1));
  EXPECT_EQ(channels.FromPeer(2).get(), opener.opened(2));
  EXPECT_EQ(channels.OpenIds(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(channels.ToPeer(3), nullptr);
  EXPECT_TRUE(channels.TakeBroken().empty());
}

TEST(DeviceChannelsTest, IgnoresChannelsOfOtherNodes) {
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith({{1, 3, 4, "a"}, {2, 4, 3, "b"}, {3, 5, 1, "c"}}), /*self_node=*/1);
  ASSERT_TRUE(WaitFor([&] { return channels.FromPeer(5) != nullptr; }));
  const std::vector<std::pair<uint64_t, bool>> expected = {{3, false}};
  EXPECT_EQ(opener.calls(), expected);
  EXPECT_EQ(channels.OpenIds(), std::vector<uint64_t>{3});
}

TEST(DeviceChannelsTest, RemovedChannelIsAbortedAndDropped) {
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));
  std::shared_ptr<DeviceChannel> held = channels.ToPeer(2);
  ASSERT_NE(held, nullptr);

  channels.Apply(StateWith({kPair[1]}), 1);  // channel 1 is no longer issued
  EXPECT_EQ(channels.ToPeer(2), nullptr);
  EXPECT_NE(channels.FromPeer(2), nullptr);
  // The holder's reference keeps the object alive, and its calls fail fast.
  EXPECT_TRUE(static_cast<FakeChannel*>(held.get())->aborted());
  EXPECT_EQ(held->Send(nullptr, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(opener.aborted(2));
  EXPECT_EQ(channels.OpenIds(), std::vector<uint64_t>{2});
  EXPECT_TRUE(channels.TakeBroken().empty());  // dropped by the coordinator, not broken
}

TEST(DeviceChannelsTest, ReissuedChannelReplacesTheOld) {
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));
  // The peer restarted: the coordinator issues channels 3 and 4 for the pair instead.
  channels.Apply(StateWith({{3, 1, 2, "u3"}, {4, 2, 1, "u4"}}), 1);
  EXPECT_TRUE(opener.aborted(1));
  EXPECT_TRUE(opener.aborted(2));
  ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));
  EXPECT_EQ(channels.OpenIds(), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(channels.ToPeer(2).get(), opener.opened(3));
  EXPECT_EQ(channels.FromPeer(2).get(), opener.opened(4));
}

TEST(DeviceChannelsTest, SameIdWithAnotherUniqueIdIsANewChannel) {
  // A restarted coordinator counts ids from 1 again.
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith({{1, 1, 2, "old"}}), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.ToPeer(2) != nullptr; }));
  std::shared_ptr<DeviceChannel> first = channels.ToPeer(2);
  channels.Apply(StateWith({{1, 1, 2, "new"}}), 1);
  EXPECT_TRUE(static_cast<FakeChannel*>(first.get())->aborted());
  ASSERT_TRUE(WaitFor([&] { return opener.calls().size() == 2 && channels.ToPeer(2) != nullptr; }));
  EXPECT_NE(channels.ToPeer(2), first);
}

TEST(DeviceChannelsTest, ChannelDroppedWhileOpeningIsAbortedWhenItOpens) {
  FakeOpener opener;
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith({kPair[0]}), 1);
  ASSERT_TRUE(WaitFor([&] { return opener.calls().size() == 1; }));
  channels.Apply(StateWith({}), 1);
  opener.Release(1);
  ASSERT_TRUE(WaitFor([&] { return opener.aborted(1); }));
  EXPECT_EQ(channels.ToPeer(2), nullptr);
  EXPECT_TRUE(channels.OpenIds().empty());
}

TEST(DeviceChannelsTest, OpenerErrorLeavesNoChannelAndIsReportedBroken) {
  FakeOpener opener;
  opener.FailWith(1, absl::DeadlineExceededError("peer never joined"));
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.FromPeer(2) != nullptr; }));
  EXPECT_EQ(channels.ToPeer(2), nullptr);
  EXPECT_EQ(channels.OpenIds(), std::vector<uint64_t>{2});
  EXPECT_EQ(channels.TakeBroken(), std::vector<uint64_t>{1});
  // The same state again does not retry it: the coordinator issues a replacement.
  channels.Apply(StateWith(kPair), 1);
  ExpectOnlyMarkerOpenedNext(opener, channels);
  EXPECT_TRUE(channels.TakeBroken().empty());
}

TEST(DeviceChannelsTest, ReportBrokenAbortsDropsAndQueuesTheIdOnce) {
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));

  std::shared_ptr<DeviceChannel> send = channels.ToPeer(2);
  channels.ReportBroken(1, absl::UnavailableError("NCCL: remote process exited"));
  channels.ReportBroken(1, absl::UnavailableError("again"));  // already dropped: ignored
  EXPECT_TRUE(static_cast<FakeChannel*>(send.get())->aborted());
  EXPECT_EQ(channels.ToPeer(2), nullptr);
  channels.ReportBrokenChannel(channels.FromPeer(2).get(), absl::DeadlineExceededError("slow"));
  EXPECT_EQ(channels.FromPeer(2), nullptr);
  channels.ReportBroken(77, absl::UnavailableError("unknown id"));  // ignored
  EXPECT_EQ(channels.TakeBroken(), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(channels.TakeBroken().empty());

  // Still listed until the coordinator replaces them: not reopened.
  channels.Apply(StateWith(kPair), 1);
  ExpectOnlyMarkerOpenedNext(opener, channels);
  EXPECT_EQ(channels.OpenIds(), std::vector<uint64_t>{3});
}

TEST(DeviceChannelsTest, RecoveringStateIsIgnored) {
  FakeOpener opener;
  opener.ReleaseAll();
  DeviceChannels channels(opener.Get());
  channels.Apply(StateWith(kPair), 1);
  ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));
  pb::ClusterState recovering;
  recovering.set_recovering(true);
  channels.Apply(recovering, 1);
  EXPECT_EQ(channels.OpenIds().size(), 2u);
}

TEST(DeviceChannelsTest, DestructorAbortsOpenChannels) {
  FakeOpener opener;
  opener.ReleaseAll();
  std::shared_ptr<DeviceChannel> held;
  {
    DeviceChannels channels(opener.Get());
    channels.Apply(StateWith(kPair), 1);
    ASSERT_TRUE(WaitFor([&] { return channels.OpenIds().size() == 2; }));
    held = channels.FromPeer(2);
  }
  EXPECT_TRUE(static_cast<FakeChannel*>(held.get())->aborted());
}

}  // namespace
}  // namespace k3
