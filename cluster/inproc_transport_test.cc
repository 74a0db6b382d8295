#include "cluster/inproc_transport.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

absl::Time Soon() { return absl::Now() + absl::Milliseconds(100); }

TEST(InProcTransportTest, ExchangesMessagesBothWays) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  std::unique_ptr<InProcTransport> b = network.CreateTransport();
  ASSERT_TRUE(a->Connect(10, b->LocalAddress()).ok());
  ASSERT_TRUE(b->Connect(20, a->LocalAddress()).ok());
  ASSERT_TRUE(a->Send(10, "to b").ok());
  ASSERT_TRUE(b->Send(20, "to a").ok());
  absl::StatusOr<Received> at_b = b->Receive(Soon());
  ASSERT_TRUE(at_b.ok());
  EXPECT_EQ(at_b->from, 20u);  // b's name for a
  EXPECT_EQ(at_b->bytes, "to b");
  absl::StatusOr<Received> at_a = a->Receive(Soon());
  ASSERT_TRUE(at_a.ok());
  EXPECT_EQ(at_a->from, 10u);
  EXPECT_EQ(at_a->bytes, "to a");
}

TEST(InProcTransportTest, ConnectValidatesAddressesAndBindings) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  std::unique_ptr<InProcTransport> b = network.CreateTransport();
  std::unique_ptr<InProcTransport> c = network.CreateTransport();
  EXPECT_EQ(a->Connect(1, "tcp://nowhere").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Connect(1, a->LocalAddress()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Connect(1, "inproc:999").code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(a->Connect(1, b->LocalAddress()).ok());
  EXPECT_TRUE(a->Connect(1, b->LocalAddress()).ok());
  EXPECT_EQ(a->Connect(1, c->LocalAddress()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a->Connect(2, b->LocalAddress()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a->Send(3, "x").code(), absl::StatusCode::kNotFound);
}

TEST(InProcTransportTest, KillIsReportedToEveryPeerAfterItsMessages) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  std::unique_ptr<InProcTransport> b = network.CreateTransport();
  std::unique_ptr<InProcTransport> c = network.CreateTransport();
  ASSERT_TRUE(a->Connect(2, b->LocalAddress()).ok());
  ASSERT_TRUE(b->Connect(1, a->LocalAddress()).ok());
  ASSERT_TRUE(c->Connect(2, b->LocalAddress()).ok());  // c only sends to b
  ASSERT_TRUE(b->Send(1, "last words").ok());
  b->Kill();
  absl::StatusOr<Received> message = a->Receive(Soon());
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(message->bytes, "last words");
  absl::StatusOr<Received> failure = a->Receive(Soon());
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(failure->kind, Received::Kind::kPeerFailed);
  EXPECT_EQ(failure->from, 2u);
  EXPECT_EQ(failure->error.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failure->error.message().find("peer 2"), std::string::npos);
  EXPECT_EQ(a->Send(2, "x").code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<Received> at_c = c->Receive(Soon());
  ASSERT_TRUE(at_c.ok());
  EXPECT_EQ(at_c->kind, Received::Kind::kPeerFailed);
  EXPECT_EQ(c->Send(2, "x").code(), absl::StatusCode::kUnavailable);
}

TEST(InProcTransportTest, GracefulCloseIsNotAFailure) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  std::unique_ptr<InProcTransport> b = network.CreateTransport();
  ASSERT_TRUE(a->Connect(2, b->LocalAddress()).ok());
  ASSERT_TRUE(b->Connect(1, a->LocalAddress()).ok());
  ASSERT_TRUE(b->Send(1, "bye").ok());
  b.reset();
  absl::StatusOr<Received> message = a->Receive(Soon());
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(message->bytes, "bye");
  EXPECT_EQ(a->Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a->Send(2, "x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(InProcTransportTest, DisconnectClosesBothDirectionsAndAllowsRebinding) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  std::unique_ptr<InProcTransport> b = network.CreateTransport();
  std::unique_ptr<InProcTransport> b2 = network.CreateTransport();
  ASSERT_TRUE(a->Connect(2, b->LocalAddress()).ok());
  ASSERT_TRUE(b->Connect(1, a->LocalAddress()).ok());
  a->Disconnect(2);
  EXPECT_EQ(a->Send(2, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Send(1, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Receive(Soon()).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(a->Connect(2, b2->LocalAddress()).ok());
  ASSERT_TRUE(a->Send(2, "to the new b").ok());
  ASSERT_TRUE(b2->Connect(1, a->LocalAddress()).ok());
  absl::StatusOr<Received> message = b2->Receive(Soon());
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(message->bytes, "to the new b");
}

TEST(InProcTransportTest, CloseWakesABlockedReceive) {
  InProcNetwork network;
  std::unique_ptr<InProcTransport> a = network.CreateTransport();
  const pid_t receiver = gettid();
  std::thread closer([&] {
    // Close only once the receiver sleeps in Receive, so that Close is what wakes it.
    EXPECT_TRUE(WaitFor([&] { return ThreadIsAsleep(receiver); }));
    a->Close();
  });
  EXPECT_EQ(a->Receive(absl::Now() + absl::Seconds(10)).status().code(),
            absl::StatusCode::kCancelled);
  closer.join();
  EXPECT_EQ(a->Send(1, "x").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace k3
