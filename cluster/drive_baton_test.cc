#include "cluster/drive_baton.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

absl::Time Far() { return absl::Now() + absl::Seconds(10); }

TEST(DriveBatonTest, AReceiverTakesAFreeBatonWithoutWakingAnyone) {
  DriveBaton baton;
  int wakes = 0;
  ASSERT_TRUE(baton.TakeForReceiver(Far(), [&] { ++wakes; }));
  EXPECT_EQ(wakes, 0);
  baton.ReleaseFromReceiver();
}

TEST(DriveBatonTest, AReceiverWakesTheHolderAndGetsTheBatonWhenItLetsGo) {
  DriveBaton baton;
  ASSERT_TRUE(baton.TakeForProgress());
  std::atomic<bool> woken{false};
  std::thread receiver([&] {
    // Retries as Inbox::Receive does: a try may run out of patience on a loaded machine.
    while (!baton.TakeForReceiver(Far(), [&] { woken = true; })) {
    }
    baton.ReleaseFromReceiver();
  });
  ASSERT_TRUE(WaitFor([&] { return woken.load(); }));  // woken while the baton is held
  baton.ReleaseFromProgress();
  receiver.join();  // and then got it
}

TEST(DriveBatonTest, AReceiverGivesUpWhenTheHolderKeepsTheBaton) {
  DriveBaton baton;
  ASSERT_TRUE(baton.TakeForProgress());
  int wakes = 0;
  const absl::Time start = absl::Now();
  EXPECT_FALSE(baton.TakeForReceiver(Far(), [&] { ++wakes; }));
  EXPECT_GE(absl::Now() - start, DriveBaton::kReceiverPatience);
  EXPECT_EQ(wakes, 1);
  // Its own deadline, when sooner, ends the wait too.
  const absl::Time soon = absl::Now() + absl::Milliseconds(1);
  EXPECT_FALSE(baton.TakeForReceiver(soon, [] {}));
  EXPECT_GE(absl::Now(), soon);
  baton.ReleaseFromProgress();
}

TEST(DriveBatonTest, TheProgressThreadWaitsTheLingerAfterAReceiverLetGo) {
  DriveBaton baton;
  ASSERT_TRUE(baton.TakeForReceiver(Far(), [] {}));
  absl::Time taken_at;
  std::thread progress([&] {
    ASSERT_TRUE(baton.TakeForProgress());
    taken_at = absl::Now();
    baton.ReleaseFromProgress();
  });
  const absl::Time released_at = absl::Now();
  baton.ReleaseFromReceiver();
  progress.join();
  EXPECT_GE(taken_at - released_at, DriveBaton::kLinger);
}

TEST(DriveBatonTest, StopEndsTheProgressThreadsWaitAndRefusesReceivers) {
  DriveBaton baton;
  ASSERT_TRUE(baton.TakeForReceiver(Far(), [] {}));  // held: the progress thread must wait
  std::atomic<pid_t> progress_tid{0};
  bool took = true;
  std::thread progress([&] {
    progress_tid = gettid();
    took = baton.TakeForProgress();
  });
  ASSERT_TRUE(WaitFor([&] { return progress_tid != 0 && ThreadIsAsleep(progress_tid); }));
  baton.Stop();
  progress.join();
  EXPECT_FALSE(took);
  baton.ReleaseFromReceiver();
  int wakes = 0;
  EXPECT_FALSE(baton.TakeForReceiver(Far(), [&] { ++wakes; }));
  EXPECT_EQ(wakes, 0);
  EXPECT_FALSE(baton.TakeForProgress());
}

TEST(DriveBatonTest, TakeForGoodWaitsForTheHolderAndKeepsTheBaton) {
  DriveBaton baton;
  ASSERT_TRUE(baton.TakeForReceiver(Far(), [] {}));
  std::atomic<pid_t> closer_tid{0};
  std::atomic<bool> kept{false};
  std::thread closer([&] {
    closer_tid = gettid();
    baton.Stop();
    baton.TakeForGood();
    kept = true;
  });
  // The closer sleeps in TakeForGood while the receiver still drives.
  ASSERT_TRUE(WaitFor([&] { return closer_tid != 0 && ThreadIsAsleep(closer_tid); }));
  EXPECT_FALSE(kept);
  baton.ReleaseFromReceiver();
  closer.join();
  EXPECT_TRUE(kept);
  EXPECT_FALSE(baton.TakeForReceiver(Far(), [] {}));
}

}  // namespace
}  // namespace k3
