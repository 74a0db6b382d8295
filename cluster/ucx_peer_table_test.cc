// UcxPeerTable against transport.h's rules for Connect and Send. The endpoints are stand-in
// pointers: the table only records them, it never calls UCX.
#include "cluster/ucx_peer_table.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr uint64_t kTokenA = 0xa;
constexpr uint64_t kTokenB = 0xb;

ucp_ep_h FakeEndpoint(int n) {
  return reinterpret_cast<ucp_ep_h>(static_cast<uintptr_t>(0x1000 * n));
}

// The status CheckBinding gives, and whether it said the binding is already there.
struct Check {
  absl::StatusCode code;
  bool done;
};

Check CheckBinding(const UcxPeerTable& table, PeerId peer, uint64_t token,
                   bool token_failed = false) {
  bool done = true;  // CheckBinding must clear it
  absl::Status status = table.CheckBinding(peer, token, token_failed, &done);
  return {status.code(), done};
}

TEST(UcxPeerTableTest, AnUnknownPeerMayBeBoundAndCannotBeSentTo) {
  UcxPeerTable table(nullptr);
  Check check = CheckBinding(table, 1, kTokenA);
  EXPECT_EQ(check.code, absl::StatusCode::kOk);
  EXPECT_FALSE(check.done);
  EXPECT_EQ(table.ForSend(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Bound(1), nullptr);
  EXPECT_EQ(table.Find(kTokenA), nullptr);
}

TEST(UcxPeerTableTest, RemotesAreKeptAtOneAddressAndNameTheirOwner) {
  auto* owner = reinterpret_cast<UcxTransport*>(uintptr_t{0x40});
  UcxPeerTable table(owner);
  bool added = false;
  UcxRemote& a = table.FindOrAdd(kTokenA, &added);
  EXPECT_TRUE(added);
  EXPECT_EQ(a.token, kTokenA);
  EXPECT_EQ(a.transport, owner);
  EXPECT_EQ(a.state, UcxRemote::State::kUp);
  EXPECT_FALSE(a.bound);
  for (uint64_t token = 100; token < 200; ++token) table.FindOrAdd(token);
  EXPECT_EQ(&table.FindOrAdd(kTokenA, &added), &a);
  EXPECT_FALSE(added);
  EXPECT_EQ(table.Find(kTokenA), &a);
  EXPECT_EQ(table.All().size(), 101u);
}

TEST(UcxPeerTableTest, ABoundPeerIsSendableAndConnectingItAgainIsANoOp) {
  UcxPeerTable table(nullptr);
  UcxRemote& a = table.FindOrAdd(kTokenA);
  table.Bind(1, a, FakeEndpoint(1), "10.0.0.1:4000");
  EXPECT_EQ(table.Bound(1), &a);
  absl::StatusOr<UcxRemote*> sendable = table.ForSend(1);
  ASSERT_TRUE(sendable.ok()) << sendable.status();
  EXPECT_EQ(*sendable, &a);
  EXPECT_EQ((*sendable)->ep, FakeEndpoint(1));
  EXPECT_EQ(a.Describe(), "peer 1 (10.0.0.1:4000)");

  Check again = CheckBinding(table, 1, kTokenA);
  EXPECT_EQ(again.code, absl::StatusCode::kOk);
  EXPECT_TRUE(again.done);
  // One PeerId, one process: both ways round.
  EXPECT_EQ(CheckBinding(table, 1, kTokenB).code, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(CheckBinding(table, 2, kTokenA).code, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(CheckBinding(table, 2, kTokenB).code, absl::StatusCode::kOk);
}

TEST(UcxPeerTableTest, AFailedProcessCannotBeSentToNorBoundAgain) {
  UcxPeerTable table(nullptr);
  UcxRemote& a = table.FindOrAdd(kTokenA);
  table.Bind(1, a, FakeEndpoint(1), "10.0.0.1:4000");
  a.state = UcxRemote::State::kFailed;
  a.ep = nullptr;
  absl::Status send = table.ForSend(1).status();
  EXPECT_EQ(send.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(send.message(), "peer 1 (10.0.0.1:4000) failed");
  EXPECT_EQ(CheckBinding(table, 1, kTokenA).code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(CheckBinding(table, 2, kTokenA).code, absl::StatusCode::kUnavailable);
  // The PeerId may be bound to a restarted process (a new token).
  EXPECT_EQ(CheckBinding(table, 1, kTokenB).code, absl::StatusCode::kOk);
  // The Inbox saw a process fail before the table did.
  EXPECT_EQ(CheckBinding(table, 2, kTokenB, /*token_failed=*/true).code,
            absl::StatusCode::kUnavailable);
}

TEST(UcxPeerTableTest, AClosingOrClosedLinkIsAFailedPrecondition) {
  UcxPeerTable table(nullptr);
  UcxRemote& a = table.FindOrAdd(kTokenA);
  table.Bind(1, a, FakeEndpoint(1), "10.0.0.1:4000");
  a.state = UcxRemote::State::kClosing;
  EXPECT_EQ(table.ForSend(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckBinding(table, 1, kTokenA).code, absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(table.Up().empty());

  a.state = UcxRemote::State::kClosed;
  a.ep = nullptr;
  EXPECT_EQ(table.ForSend(1).status().code(), absl::StatusCode::kFailedPrecondition);
  // Closed gracefully: it may be connected again.
  Check check = CheckBinding(table, 1, kTokenA);
  EXPECT_EQ(check.code, absl::StatusCode::kOk);
  EXPECT_FALSE(check.done);
}

TEST(UcxPeerTableTest, ALinkThePeerClosedNeedsAConnectBeforeSending) {
  UcxPeerTable table(nullptr);
  UcxRemote& a = table.FindOrAdd(kTokenA);
  table.Bind(1, a, FakeEndpoint(1), "10.0.0.1:4000");
  // The peer closed, then connected to us again: up, but our endpoint is gone until we connect.
  a.ep = nullptr;
  absl::Status send = table.ForSend(1).status();
  EXPECT_EQ(send.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(send.message().find("connect it again"), absl::string_view::npos) << send;
  Check check = CheckBinding(table, 1, kTokenA);
  EXPECT_EQ(check.code, absl::StatusCode::kOk);
  EXPECT_FALSE(check.done);
  table.Bind(1, a, FakeEndpoint(2), "10.0.0.1:4000");
  EXPECT_TRUE(table.ForSend(1).ok());
}

TEST(UcxPeerTableTest, RebindingAPeerIdUnbindsItsOldProcess) {
  UcxPeerTable table(nullptr);
  UcxRemote& a = table.FindOrAdd(kTokenA);
  table.Bind(1, a, FakeEndpoint(1), "10.0.0.1:4000");
  a.state = UcxRemote::State::kFailed;
  UcxRemote& b = table.FindOrAdd(kTokenB);
  table.Bind(1, b, FakeEndpoint(2), "10.0.0.2:4000");
  EXPECT_EQ(table.Bound(1), &b);
  EXPECT_FALSE(a.bound);
  EXPECT_EQ(a.Describe(), "process at 10.0.0.1:4000");
  EXPECT_EQ(b.Describe(), "peer 1 (10.0.0.2:4000)");
  ASSERT_EQ(table.Up().size(), 1u);
  EXPECT_EQ(table.Up()[0], &b);
}

}  // namespace
}  // namespace k3
