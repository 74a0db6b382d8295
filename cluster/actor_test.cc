#include "cluster/actor.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(ActorTest, PostsFromOneThreadRunInOrderOnTheActorThread) {
  Actor actor("order");
  std::vector<int> seen;  // touched only by the actor thread until Stop joins it
  std::atomic<bool> all_on_actor{true};
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(actor.Post([&, i] {
      if (!actor.IsCurrent()) all_on_actor = false;
      seen.push_back(i);
    }));
  }
  actor.Stop();
  EXPECT_TRUE(all_on_actor);
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
}

TEST(ActorTest, ConcurrentPostersNeedNoLockForActorState) {
  Actor actor("counter");
  int64_t sum = 0;  // actor-owned
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t value = int64_t{t} * kPerThread + i;
        actor.Post([&sum, value] { sum += value; });
      }
    });
  }
  for (auto& th : threads) th.join();
  const int64_t n = kThreads * kPerThread;
  absl::StatusOr<int64_t> got = actor.Call([&sum] { return sum; }, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, n * (n - 1) / 2);  // sum of 0..n-1
}

TEST(ActorTest, CallReturnsValuesAndFlattensStatuses) {
  Actor actor("call");
  absl::StatusOr<std::string> s = actor.Call([] { return std::string("hi"); }, Soon());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "hi");

  absl::Status st = actor.Call([] { return absl::NotFoundError("x"); }, Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);

  absl::StatusOr<int> so =
      actor.Call([]() -> absl::StatusOr<int> { return absl::InvalidArgumentError("bad"); }, Soon());
  EXPECT_EQ(so.status().code(), absl::StatusCode::kInvalidArgument);

  bool ran = false;
  absl::Status v = actor.Call([&ran] { ran = true; }, Soon());
  EXPECT_TRUE(v.ok());
  EXPECT_TRUE(ran);
}

TEST(ActorTest, CallFromTheActorThreadRunsInline) {
  Actor actor("inline");
  absl::StatusOr<int> outer = actor.Call(
      [&actor]() -> absl::StatusOr<int> {
        // Waiting on the mailbox from inside it would deadlock; Call runs inline instead.
        return actor.Call([] { return 7; }, absl::Now() + absl::Milliseconds(50));
      },
      Soon());
  ASSERT_TRUE(outer.ok()) << outer.status();
  EXPECT_EQ(*outer, 7);
}

TEST(ActorTest, CallTimesOutWhileTheActorIsBusyAndTheClosureStillRunsLater) {
  Actor actor("busy");
  absl::Notification release;
  actor.Post([&release] { release.WaitForNotification(); });
  std::atomic<bool> late_ran{false};
  const absl::Time start = absl::Now();
  absl::Status st = actor.Call([&late_ran] { late_ran = true; }, start + absl::Milliseconds(100));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(waited, absl::Milliseconds(100));
  EXPECT_LT(waited, absl::Seconds(2));
  EXPECT_FALSE(late_ran);
  release.Notify();
  actor.Stop();  // runs what was already queued
  EXPECT_TRUE(late_ran);
}

TEST(ActorTest, TimersRunInDueOrderAfterTheirDelay) {
  Actor actor("timers");
  std::vector<int> order;  // actor-owned
  std::vector<absl::Duration> after;
  absl::Notification done;
  const absl::Time start = absl::Now();
  auto record = [&](int id) {
    return [&, id] {
      order.push_back(id);
      after.push_back(absl::Now() - start);
      if (order.size() == 3) done.Notify();
    };
  };
  actor.PostAfter(absl::Milliseconds(120), record(3));
  actor.PostAfter(absl::Milliseconds(40), record(1));
  actor.PostAfter(absl::Milliseconds(80), record(2));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  actor.Stop();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(after[0], absl::Milliseconds(40));
  EXPECT_GE(after[1], absl::Milliseconds(80));
  EXPECT_GE(after[2], absl::Milliseconds(120));
}

TEST(ActorTest, StopDropsPendingTimersAndRejectsNewWork) {
  Actor actor("stop");
  std::atomic<bool> timer_ran{false};
  ASSERT_TRUE(actor.PostAfter(absl::Seconds(60), [&timer_ran] { timer_ran = true; }));
  const absl::Time start = absl::Now();
  actor.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // did not wait for the timer
  EXPECT_FALSE(timer_ran);
  EXPECT_FALSE(actor.Post([] {}));
  EXPECT_FALSE(actor.PostAfter(absl::ZeroDuration(), [] {}));
  EXPECT_EQ(actor.Call([] { return 1; }, Soon()).status().code(), absl::StatusCode::kUnavailable);
  actor.Stop();  // idempotent
}

TEST(ActorTest, ClosuresPostedFromTheActorAfterStopBeganAreRejected) {
  Actor actor("repost");
  std::atomic<int> runs{0};
  absl::Notification started;
  absl::Notification release;
  std::atomic<bool> repost_accepted{true};
  actor.Post([&] {
    started.Notify();
    release.WaitForNotification();
    ++runs;
    repost_accepted = actor.Post([&runs] { ++runs; });
  });
  started.WaitForNotification();
  std::thread stopper([&actor] { actor.Stop(); });
  // Once a Post from here is refused, Stop has begun; the closure's repost must be refused too.
  while (actor.Post([] {})) absl::SleepFor(absl::Milliseconds(1));
  release.Notify();
  stopper.join();
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(repost_accepted);
}

}  // namespace
}  // namespace k3
