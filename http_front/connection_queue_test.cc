#include "http_front/connection_queue.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// Every connection within the limit runs at once, however many: none waits for another's thread
// (a fixed pool of 64 would leave 136 of these waiting for ever, since none ends until all run).
TEST(ConnectionQueueTest, EveryConnectionWithinTheLimitRunsAtOnce) {
  constexpr int kConnections = 200;
  ConnectionQueue queue(kConnections, absl::Seconds(10), nullptr);
  std::atomic<int> running{0};
  std::atomic<int> shed{0};
  absl::Notification all_running;
  for (int i = 0; i < kConnections; ++i) {
    queue.enqueue([&] {
      shed += ConnectionQueue::Shedding();
      if (++running == kConnections) all_running.Notify();
      all_running.WaitForNotification();
    });
  }
  EXPECT_TRUE(all_running.WaitForNotificationWithTimeout(absl::Seconds(60)));
  queue.shutdown();
  EXPECT_EQ(shed, 0);
}

// Past the limit a connection still runs, on its own thread, with Shedding() true, and is
// counted; once the connections in flight end, new ones are served again.
TEST(ConnectionQueueTest, ConnectionsPastTheLimitAreShed) {
  std::atomic<int> counted{0};
  ConnectionQueue queue(2, absl::Seconds(10), [&] { ++counted; });
  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i) {
    queue.enqueue([&] {
      EXPECT_FALSE(ConnectionQueue::Shedding());
      ++started;
      release.WaitForNotification();
    });
  }
  absl::Notification shed_ran;
  queue.enqueue([&] {
    EXPECT_TRUE(ConnectionQueue::Shedding());
    shed_ran.Notify();
  });
  EXPECT_TRUE(shed_ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(counted, 1);
  release.Notify();
  // The two end; a new connection is within the limit again.
  while (started < 2) absl::SleepFor(absl::Milliseconds(1));
  absl::Notification served;
  for (int attempt = 0; attempt < 1000 && !served.HasBeenNotified(); ++attempt) {
    absl::Notification ran;
    bool shedding = true;
    queue.enqueue([&] {
      shedding = ConnectionQueue::Shedding();
      ran.Notify();
    });
    ran.WaitForNotification();
    if (!shedding) served.Notify();
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(served.HasBeenNotified());
}

// Threads without work end after the idle timeout; connections queued at shutdown are served.
TEST(ConnectionQueueTest, ShutdownServesWhatWasAccepted) {
  ConnectionQueue queue(4, absl::Milliseconds(1), nullptr);
  std::atomic<int> served{0};
  for (int i = 0; i < 50; ++i) {
    queue.enqueue([&] { ++served; });
    if (i % 10 == 0) absl::SleepFor(absl::Milliseconds(5));  // idle threads end meanwhile
  }
  queue.shutdown();
  EXPECT_EQ(served, 50);
}

}  // namespace
}  // namespace k3
