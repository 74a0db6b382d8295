#include "cluster/peer_links.h"

#include <memory>

#include "cluster/inproc_transport.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr absl::Duration kRetry = absl::Milliseconds(20);
constexpr absl::Duration kWait = absl::Seconds(5);

PeerTarget Target(PeerId peer, uint64_t incarnation, const Transport& transport, bool alive = true) {
  PeerTarget target;
  target.peer = peer;
  target.incarnation = incarnation;
  target.address = transport.LocalAddress();
  target.alive = alive;
  target.name = "node " + std::to_string(peer);
  return target;
}

// The next message `transport` receives, as "from:bytes", or the error.
std::string NextMessage(Transport& transport) {
  absl::StatusOr<Received> received = transport.Receive(absl::Now() + kWait);
  if (!received.ok()) return std::string(received.status().message());
  if (received->kind != Received::Kind::kMessage) return "failure";
  return std::to_string(received->from) + ":" + std::string(received->bytes.view());
}

TEST(PeerLinksTest, ConnectsAliveTargetsOnly) {
  InProcNetwork network;
  auto self = network.CreateTransport();
  auto a = network.CreateTransport();
  auto b = network.CreateTransport();
  PeerLinks links(self.get(), kRetry);
  const uint64_t before = links.version();
  links.SetTargets({Target(1, 11, *a), Target(2, 22, *b, /*alive=*/false)});
  // b is DEAD in the state: never connected, so WaitAllConnected need not wait for it.
  ASSERT_TRUE(links.WaitAllConnected(absl::Now() + kWait));
  EXPECT_TRUE(links.LinkStatus(1).ok());
  EXPECT_EQ(links.LinkStatus(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(links.LinkStatus(3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GT(links.version(), before);
  ASSERT_TRUE(self->Send(1, "hello").ok());
  ASSERT_TRUE(a->Connect(50, self->LocalAddress()).ok());
  EXPECT_EQ(NextMessage(*a), "50:hello");
}

TEST(PeerLinksTest, FailedPeerStaysLostUntilANewProcessTakesItsId) {
  InProcNetwork network;
  auto self = network.CreateTransport();
  auto old_process = network.CreateTransport();
  PeerLinks links(self.get(), kRetry);
  links.SetTargets({Target(5, 1, *old_process)});
  ASSERT_TRUE(links.WaitAllConnected(absl::Now() + kWait));

  old_process->Kill();
  absl::StatusOr<Received> failure = self->Receive(absl::Now() + kWait);
  ASSERT_TRUE(failure.ok()) << failure.status();
  ASSERT_EQ(failure->kind, Received::Kind::kPeerFailed);
  const uint64_t before = links.version();
  links.MarkFailed(5, failure->error);
  EXPECT_GT(links.version(), before);
  absl::Status lost = links.LinkStatus(5);
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lost.message(), failure->error.message());
  // The same state again does not bring it back: once the links have acted on that target set
  // (a live peer beside it got connected), peer 5 is still failed.
  auto witness = network.CreateTransport();
  links.SetTargets({Target(5, 1, *old_process), Target(6, 1, *witness)});
  ASSERT_TRUE(WaitFor([&] { return links.LinkStatus(6).ok(); }, kWait));
  EXPECT_EQ(links.LinkStatus(5).code(), absl::StatusCode::kUnavailable);

  // A restarted process under the same id (another incarnation and address) is connected anew.
  auto new_process = network.CreateTransport();
  links.SetTargets({Target(5, 2, *new_process)});
  ASSERT_TRUE(links.WaitAllConnected(absl::Now() + kWait));
  EXPECT_TRUE(links.LinkStatus(5).ok());
  ASSERT_TRUE(self->Send(5, "again").ok());
  ASSERT_TRUE(new_process->Connect(60, self->LocalAddress()).ok());
  EXPECT_EQ(NextMessage(*new_process), "60:again");
}

TEST(PeerLinksTest, DisconnectsMembersThatLeft) {
  InProcNetwork network;
  auto self = network.CreateTransport();
  auto a = network.CreateTransport();
  PeerLinks links(self.get(), kRetry);
  links.SetTargets({Target(1, 11, *a)});
  ASSERT_TRUE(links.WaitAllConnected(absl::Now() + kWait));
  links.SetTargets({});
  EXPECT_EQ(links.LinkStatus(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(WaitFor([&] { return !self->Send(1, "x").ok(); }, kWait));
  EXPECT_EQ(self->Send(1, "x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PeerLinksTest, RetriesUntilThePeerIsReachable) {
  InProcNetwork network;
  auto self = network.CreateTransport();
  PeerTarget target;
  target.peer = 3;
  target.incarnation = 1;
  target.address = "inproc:999";  // nobody there
  target.alive = true;
  PeerLinks links(self.get(), kRetry);
  links.SetTargets({target});
  EXPECT_FALSE(links.WaitAllConnected(absl::Now() + 5 * kRetry));
  absl::Status status = links.LinkStatus(3);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("cannot connect"), absl::string_view::npos) << status;
}

TEST(PeerLinksTest, LinkTargetsPicksRolesAndSkipsLeftMembersAndSelf) {
  pb::ClusterState state;
  auto add = [&](uint32_t id, pb::Role role, pb::MemberState member_state) {
    pb::Member* member = state.add_members();
    member->mutable_node()->set_node_id(id);
    member->mutable_node()->set_role(role);
    member->mutable_node()->set_transport_address("inproc:" + std::to_string(id));
    member->mutable_node()->set_incarnation(100 + id);
    member->mutable_node()->set_pid(1000 + id);
    member->mutable_node()->set_host("h");
    member->set_state(member_state);
  };
  add(1, pb::ROLE_ATTENTION, pb::ALIVE);
  add(2, pb::ROLE_ROUTER, pb::ALIVE);
  add(3, pb::ROLE_EXPERT, pb::DEAD);
  add(4, pb::ROLE_EXPERT, pb::LEFT);
  add(5, pb::ROLE_EXPERT, pb::ALIVE);
  std::vector<PeerTarget> targets =
      LinkTargets(state, {pb::ROLE_ATTENTION, pb::ROLE_EXPERT}, /*self=*/5);
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[0].peer, 1u);
  EXPECT_TRUE(targets[0].alive);
  EXPECT_EQ(targets[0].incarnation, 101u);
  EXPECT_EQ(targets[0].address, "inproc:1");
  EXPECT_EQ(targets[0].name, "attention node 1 (pid 1001 on h)");
  EXPECT_EQ(targets[1].peer, 3u);
  EXPECT_FALSE(targets[1].alive);
}

}  // namespace
}  // namespace k3
