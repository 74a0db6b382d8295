#include "cluster/inbox.h"

#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

std::string Next(Inbox& inbox) {
  absl::StatusOr<Received> received = inbox.Receive(Soon());
  if (!received.ok()) return received.status().ToString();
  if (received->kind == Received::Kind::kPeerFailed) return absl::StrCat("failed:", received->from);
  return absl::StrCat(received->from, ":", std::string(received->bytes.view()));
}

TEST(InboxTest, DeliversInArrivalOrderUnderTheBoundName) {
  Inbox inbox;
  inbox.Bind(100, 1);
  inbox.Bind(200, 2);
  inbox.Deliver(100, "a");
  inbox.Deliver(200, "b");
  inbox.Deliver(100, "c");
  EXPECT_EQ(Next(inbox), "1:a");
  EXPECT_EQ(Next(inbox), "2:b");
  EXPECT_EQ(Next(inbox), "1:c");
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InboxTest, HoldsMessagesUntilTheSenderIsBound) {
  Inbox inbox;
  inbox.Deliver(100, "early");
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  inbox.Bind(100, 7);
  inbox.Deliver(100, "late");
  EXPECT_EQ(Next(inbox), "7:early");
  EXPECT_EQ(Next(inbox), "7:late");
}

TEST(InboxTest, KeepsPerSenderOrderWhileALargeMessageFills) {
  Inbox inbox;
  inbox.Bind(100, 1);
  inbox.Bind(200, 2);
  Inbox::Slot big = inbox.Reserve(100);
  inbox.Deliver(100, "small after big");
  inbox.Deliver(200, "other sender");
  // The other sender is not held up by sender 1's pending message; sender 1's later one is.
  EXPECT_EQ(Next(inbox), "2:other sender");
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  inbox.Fill(big, "big");
  EXPECT_EQ(Next(inbox), "1:big");
  EXPECT_EQ(Next(inbox), "1:small after big");
}

TEST(InboxTest, DroppedSlotReleasesLaterMessages) {
  Inbox inbox;
  inbox.Bind(100, 1);
  Inbox::Slot lost = inbox.Reserve(100);
  inbox.Deliver(100, "next");
  inbox.Drop(lost);
  EXPECT_EQ(Next(inbox), "1:next");
}

TEST(InboxTest, FailureComesAfterTheSendersMessagesAndOnlyOnce) {
  Inbox inbox;
  inbox.Bind(100, 1);
  Inbox::Slot pending = inbox.Reserve(100);
  inbox.Deliver(100, "before");
  inbox.Fail(100, absl::UnavailableError("peer 1 died"));
  inbox.Fail(100, absl::UnavailableError("again"));
  inbox.Deliver(100, "after death");
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  inbox.Fill(pending, "pending");
  EXPECT_EQ(Next(inbox), "1:pending");
  EXPECT_EQ(Next(inbox), "1:before");
  absl::StatusOr<Received> failure = inbox.Receive(Soon());
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(failure->kind, Received::Kind::kPeerFailed);
  EXPECT_EQ(failure->error.message(), "peer 1 died");
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(inbox.Failed(100));
}

TEST(InboxTest, FailureOfAnUnboundSenderDropsItsHeldMessagesSilently) {
  Inbox inbox;
  inbox.Deliver(100, "held");
  Inbox::Slot slot = inbox.Reserve(100);
  inbox.Fail(100, absl::UnavailableError("gone"));
  inbox.Fill(slot, "late");
  inbox.Bind(100, 1);
  EXPECT_EQ(inbox.Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InboxTest, QueuedCountsWhatBoundSendersQueuedUntilReceived) {
  Inbox inbox;
  inbox.Bind(100, 1);
  inbox.Deliver(100, "a");
  inbox.Reserve(100);  // still arriving: queued too
  inbox.Deliver(200, "held");  // unbound: not queued for Receive
  EXPECT_EQ(inbox.Queued(), 2u);
  inbox.Bind(200, 2);
  EXPECT_EQ(inbox.Queued(), 3u);
  ASSERT_TRUE(inbox.Receive(Soon()).ok());
  EXPECT_EQ(inbox.Queued(), 2u);
}

TEST(InboxTest, ReceiveWakesOnDeliveryAndOnClose) {
  Inbox inbox;
  inbox.Bind(100, 1);
  const pid_t receiver = gettid();
  std::atomic<bool> first_received{false};
  // Each event comes only once the receiver sleeps in Receive, so that it is what wakes it.
  std::thread sender([&] {
    EXPECT_TRUE(WaitFor([&] { return ThreadIsAsleep(receiver); }));
    inbox.Deliver(100, "x");
    EXPECT_TRUE(WaitFor([&] { return first_received.load() && ThreadIsAsleep(receiver); }));
    inbox.Close();
  });
  absl::StatusOr<Received> first = inbox.Receive(absl::Now() + absl::Seconds(10));
  first_received = true;
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->bytes, "x");
  absl::Time start = absl::Now();
  EXPECT_EQ(inbox.Receive(absl::Now() + absl::Seconds(10)).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  sender.join();
}

TEST(InboxTest, ReceiveLetsTheCallerDriveDeliveries) {
  Inbox inbox;
  inbox.Bind(100, 1);
  int drives = 0;
  // The caller's own drive produces the message: no other thread is involved.
  absl::StatusOr<Received> received =
      inbox.Receive(absl::Now() + absl::Seconds(10), [&](absl::Time) {
        if (++drives == 3) inbox.Deliver(100, "driven");
        return true;
      });
  ASSERT_TRUE(received.ok());
  EXPECT_EQ(received->bytes, "driven");
  EXPECT_EQ(drives, 3);
}

TEST(InboxTest, ACallerThatCannotDriveWaitsForAnotherThreadsDelivery) {
  Inbox inbox;
  inbox.Bind(100, 1);
  // The delivery comes once the caller has found nothing and been refused a drive, so it is
  // another thread's delivery that the caller waits for.
  std::atomic<int> refused{0};
  std::thread producer([&] {
    EXPECT_TRUE(WaitFor([&] { return refused.load() > 0; }));
    inbox.Deliver(100, "from elsewhere");
  });
  absl::StatusOr<Received> received =
      inbox.Receive(absl::Now() + absl::Seconds(10), [&](absl::Time) {
        refused.fetch_add(1);
        return false;
      });
  producer.join();
  ASSERT_TRUE(received.ok());
  EXPECT_EQ(received->bytes, "from elsewhere");
  // Nothing more: the deadline is honored even though drive keeps refusing.
  const absl::Time start = absl::Now();
  EXPECT_EQ(inbox.Receive(start + absl::Milliseconds(50), [](absl::Time) { return false; })
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

}  // namespace
}  // namespace k3
