#include "coordinator/coordinator.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

const absl::Time kStart = absl::FromUnixSeconds(1700000000);
constexpr absl::Duration kBeat = absl::Milliseconds(250);

CoordinatorOptions Options(int layers, int experts, int expected) {
  CoordinatorOptions options;
  options.num_moe_layers = layers;
  options.num_experts = experts;
  options.expected_expert_nodes = expected;
  options.recovery_window = absl::ZeroDuration();
  return options;
}

pb::NodeInfo Node(pb::Role role, int slots = 0, uint64_t incarnation = 0) {
  static uint64_t next_incarnation = 1000;
  pb::NodeInfo info;
  info.set_role(role);
  info.set_grpc_address(absl::StrCat("10.0.0.1:", 5000 + next_incarnation));
  info.set_expert_slots(slots);
  info.set_incarnation(incarnation != 0 ? incarnation : next_incarnation++);
  info.set_pid(42);
  info.set_host("test");
  return info;
}

// Registers `info` (with its node_id) and returns the id, or 0 on error.
uint32_t Join(CoordinatorState& c, const pb::NodeInfo& info, absl::Time now,
              const pb::ExpertPlacement* known = nullptr) {
  pb::RegisterRequest request;
  *request.mutable_node() = info;
  if (known != nullptr) *request.mutable_known_placement() = *known;
  absl::StatusOr<pb::RegisterResponse> response = c.Register(request, now);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? response->node_id() : 0;
}

absl::Status TryJoin(CoordinatorState& c, const pb::NodeInfo& info, absl::Time now) {
  pb::RegisterRequest request;
  *request.mutable_node() = info;
  return c.Register(request, now).status();
}

pb::MemberState StateOf(const CoordinatorState& c, uint32_t id) {
  const pb::ClusterState state = c.State();
  for (const pb::Member& m : state.members()) {
    if (m.node().node_id() == id) return m.state();
  }
  return pb::MEMBER_STATE_UNSPECIFIED;
}

// Independent check of a contiguous placement: in every layer, worker w holds exactly the experts
// [begin[w], begin[w+1]) and nothing else.
void ExpectSlices(const ExpertPlacement& p, const std::vector<int>& begin) {
  ASSERT_EQ(p.num_workers + 1, static_cast<int>(begin.size()));
  for (int layer = 0; layer < p.num_layers(); ++layer) {
    for (int w = 0; w < p.num_workers; ++w) {
      std::vector<int> want;
      for (int e = begin[w]; e < begin[w + 1]; ++e) want.push_back(e);
      EXPECT_EQ(p.ExpertsOn(w, layer), want) << "layer " << layer << " worker " << w;
    }
  }
}

TEST(CoordinatorTest, RejectsBadNodeInfo) {
  CoordinatorState c(Options(2, 8, 1), kStart);
  pb::NodeInfo info = Node(pb::ROLE_ATTENTION);
  info.set_role(pb::ROLE_COORDINATOR);
  EXPECT_EQ(TryJoin(c, info, kStart).code(), absl::StatusCode::kInvalidArgument);
  info = Node(pb::ROLE_ATTENTION);
  info.clear_grpc_address();
  EXPECT_EQ(TryJoin(c, info, kStart).code(), absl::StatusCode::kInvalidArgument);
  info = Node(pb::ROLE_ATTENTION);
  info.set_incarnation(0);
  EXPECT_EQ(TryJoin(c, info, kStart).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TryJoin(c, Node(pb::ROLE_EXPERT, /*slots=*/0), kStart).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.State().members().empty());
}

TEST(CoordinatorTest, ReadyOnceEveryRoleIsUpAndTheExpertsArePlaced) {
  CoordinatorState c(Options(/*layers=*/3, /*experts=*/10, /*expected=*/3), kStart);
  EXPECT_FALSE(c.ready());
  const uint32_t a = Join(c, Node(pb::ROLE_ATTENTION), kStart);
  const uint32_t r = Join(c, Node(pb::ROLE_ROUTER), kStart);
  EXPECT_NE(a, r);
  EXPECT_NE(c.not_ready_reason().find("ROLE_EXPERT"), std::string::npos) << c.not_ready_reason();
  const uint32_t e1 = Join(c, Node(pb::ROLE_EXPERT, 2), kStart);
  const uint32_t e2 = Join(c, Node(pb::ROLE_EXPERT, 3), kStart);
  EXPECT_FALSE(c.placement().placed());
  EXPECT_NE(c.not_ready_reason().find("2 of 3"), std::string::npos) << c.not_ready_reason();
  const uint32_t e3 = Join(c, Node(pb::ROLE_EXPERT, 5), kStart);
  ASSERT_TRUE(c.ready()) << c.not_ready_reason();

  // Slots summing to the expert count give slices of exactly those sizes, in node-id order.
  const ClusterPlacement& p = c.placement();
  EXPECT_EQ(p.version(), 1);
  EXPECT_EQ(p.worker_nodes, (std::vector<uint32_t>{e1, e2, e3}));
  EXPECT_EQ(p.experts.num_layers(), 3);
  ExpectSlices(p.experts, {0, 2, 5, 10});

  // The state message carries the same placement and every member.
  const pb::ClusterState state = c.State();
  EXPECT_TRUE(state.ready());
  EXPECT_EQ(state.members_size(), 5);
  EXPECT_EQ(*ClusterPlacementFromProto(state.placement()), p);
}

TEST(CoordinatorTest, UnevenSlotsGiveProportionalSlicesWithinCapacity) {
  CoordinatorState c(Options(1, 8, 3), kStart);
  Join(c, Node(pb::ROLE_ATTENTION), kStart);
  Join(c, Node(pb::ROLE_ROUTER), kStart);
  for (int slots : {4, 4, 8}) Join(c, Node(pb::ROLE_EXPERT, slots), kStart);
  ASSERT_TRUE(c.ready()) << c.not_ready_reason();
  // 16 slots for 8 experts: each node gets half its slots' worth.
  ExpectSlices(c.placement().experts, {0, 2, 4, 8});
}

TEST(CoordinatorTest, TooFewSlotsIsNotReadyWithAReason) {
  CoordinatorState c(Options(1, 8, 2), kStart);
  Join(c, Node(pb::ROLE_ATTENTION), kStart);
  Join(c, Node(pb::ROLE_ROUTER), kStart);
  Join(c, Node(pb::ROLE_EXPERT, 3), kStart);
  Join(c, Node(pb::ROLE_EXPERT, 4), kStart);
  EXPECT_FALSE(c.ready());
  EXPECT_FALSE(c.placement().placed());
  EXPECT_NE(c.not_ready_reason().find("cannot place"), std::string::npos) << c.not_ready_reason();
}

// A cluster of attention, router and `experts` expert nodes (4 slots each, 8 experts, 2 layers,
// the first two expert nodes placed), heartbeating every 250 ms from kStart until `until`.
CoordinatorOptions WithReplicas(CoordinatorOptions options, int replica_slots) {
  options.replica_slots_per_worker = replica_slots;
  return options;
}

struct Cluster {
  explicit Cluster(int experts, int replica_slots = 0, int slots = 4)
      : c(WithReplicas(Options(2, 8, 2), replica_slots), kStart) {
    infos.push_back(Node(pb::ROLE_ATTENTION));
    infos.push_back(Node(pb::ROLE_ROUTER));
    for (int i = 0; i < experts; ++i) infos.push_back(Node(pb::ROLE_EXPERT, slots));
    for (pb::NodeInfo& info : infos) info.set_node_id(Join(c, info, kStart));
    now = kStart;
  }
  // Advances time in heartbeat steps; every node in `beating` heartbeats, then the coordinator
  // ticks twice per interval as its service does.
  void Run(absl::Duration d, const std::set<uint32_t>& silent = {}) {
    for (absl::Time end = now + d; now < end;) {
      now += kBeat / 2;
      c.Tick(now);
      now += kBeat / 2;
      for (const pb::NodeInfo& info : infos) {
        if (silent.count(info.node_id()) == 0) {
          HeartbeatReply reply = c.Heartbeat(info.node_id(), info.incarnation(), {}, now);
          EXPECT_FALSE(reply.unknown_node);
        }
      }
      c.Tick(now);
    }
  }
  uint32_t id(int i) const { return infos[i].node_id(); }

  CoordinatorState c;
  std::vector<pb::NodeInfo> infos;
  absl::Time now;
};

TEST(CoordinatorTest, ASilentNodeIsDeadAfterTheTimeoutAndASpareTakesOverItsWorker) {
  Cluster cl(/*experts=*/3);
  ASSERT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  const uint32_t victim = cl.id(2);  // worker 0
  const uint32_t spare = cl.id(4);
  ASSERT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{victim, cl.id(3)}));
  cl.Run(absl::Seconds(1));

  // The victim's last heartbeat is at cl.now. DEAD takes more than 1.5 s of silence and is seen
  // at the first tick after that: within 1.75 s with ticks every 125 ms.
  const absl::Time last = cl.now;
  const uint64_t members_before = cl.c.members_version();
  cl.Run(absl::Milliseconds(1500), {victim});
  EXPECT_EQ(StateOf(cl.c, victim), pb::ALIVE);
  absl::Time dead_at = absl::InfiniteFuture();
  while (cl.now < last + absl::Seconds(3) && dead_at == absl::InfiniteFuture()) {
    cl.Run(kBeat / 2 * 2, {victim});
    if (StateOf(cl.c, victim) == pb::DEAD) dead_at = cl.now;
  }
  EXPECT_LE(dead_at - last, absl::Milliseconds(1750));
  EXPECT_GT(cl.c.members_version(), members_before);

  // The spare holds worker 0 now, under a new version, and the cluster is ready again.
  EXPECT_EQ(cl.c.placement().version(), 2);
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{spare, cl.id(3)}));
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();

  // The victim comes back: alive again, but it is now the spare.
  HeartbeatReply back = cl.c.Heartbeat(victim, cl.infos[2].incarnation(), {}, cl.now);
  EXPECT_FALSE(back.unknown_node);
  EXPECT_EQ(back.placement_version, 2);
  EXPECT_EQ(StateOf(cl.c, victim), pb::ALIVE);
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{spare, cl.id(3)}));
}

// A coordinator that was stopped (SIGSTOP) or starved for 3 s read no heartbeats meanwhile: when it
// ticks again nobody is DEAD for that, and a node that stays silent after it still is, on time.
TEST(CoordinatorTest, TimeTheCoordinatorDidNotRunDoesNotCountAgainstHeartbeats) {
  Cluster cl(/*experts=*/3);
  cl.Run(absl::Seconds(1));
  const uint64_t members_before = cl.c.members_version();
  cl.now += absl::Seconds(3);
  cl.c.Tick(cl.now);
  for (const pb::NodeInfo& info : cl.infos) {
    EXPECT_EQ(StateOf(cl.c, info.node_id()), pb::ALIVE) << info.node_id();
  }
  EXPECT_EQ(cl.c.members_version(), members_before);
  const uint32_t victim = cl.id(2);
  cl.Run(absl::Seconds(1), {victim});
  EXPECT_EQ(StateOf(cl.c, victim), pb::ALIVE);
  cl.Run(absl::Seconds(1), {victim});
  EXPECT_EQ(StateOf(cl.c, victim), pb::DEAD);
  EXPECT_EQ(StateOf(cl.c, cl.id(3)), pb::ALIVE);
}

// With ring replicas every expert of a dead worker still has a live host; a spare (its declared
// slots plus the spare slots every node has) takes over anyway, so that each expert has two live
// hosts again.
TEST(CoordinatorTest, ASpareRestoresTheReplicasOfADeadWorker) {
  Cluster cl(/*experts=*/3, /*replica_slots=*/4);
  ASSERT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  const uint32_t victim = cl.id(2);  // worker 0
  const uint32_t spare = cl.id(4);
  ASSERT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{victim, cl.id(3)}));
  for (int layer = 0; layer < 2; ++layer) {
    for (int e = 0; e < 8; ++e) {
      ASSERT_EQ(cl.c.placement().experts.WorkersFor(layer, e).size(), 2u);
    }
  }
  cl.Run(absl::Seconds(3), {victim});
  EXPECT_EQ(StateOf(cl.c, victim), pb::DEAD);
  EXPECT_EQ(cl.c.placement().version(), 2);
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{spare, cl.id(3)}));
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
}

// A rebalancing rollout reserves its version first; a spare taking over meanwhile gets a later one,
// and the rollout's commit is then refused.
TEST(CoordinatorTest, AReservedVersionIsNeverReusedAndAStaleRolloutIsRefused) {
  Cluster cl(/*experts=*/3);
  ASSERT_EQ(cl.c.placement().version(), 1);
  EXPECT_EQ(cl.c.ReservePlacementVersion(2).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<int64_t> reserved = cl.c.ReservePlacementVersion(1);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(*reserved, 2);

  // A rebalanced placement: expert 0 of layer 0 replicated on both workers.
  ClusterPlacement next = cl.c.placement();
  next.experts.version = *reserved;
  next.experts.hosts[0][0] = {0, 1};
  ClusterPlacement unreserved = next;
  unreserved.experts.version = 3;
  EXPECT_EQ(cl.c.CommitPlacement(unreserved, 1, cl.now).code(),
            absl::StatusCode::kInvalidArgument);
  ClusterPlacement invalid = next;
  invalid.experts.hosts[0][0] = {};
  EXPECT_EQ(cl.c.CommitPlacement(invalid, 1, cl.now).code(), absl::StatusCode::kInvalidArgument);
  ClusterPlacement other_nodes = next;
  other_nodes.worker_nodes[0] = cl.id(1);  // the router
  EXPECT_EQ(cl.c.CommitPlacement(other_nodes, 1, cl.now).code(), absl::StatusCode::kAborted);

  // Worker 0 dies; the spare takes over under version 3, not the reserved 2.
  cl.Run(absl::Seconds(2), {cl.id(2)});
  EXPECT_EQ(cl.c.placement().version(), 3);
  EXPECT_EQ(cl.c.placement().worker_nodes[0], cl.id(4));
  EXPECT_EQ(cl.c.CommitPlacement(next, 1, cl.now).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(cl.c.placement().version(), 3);

  // A rollout on top of version 3 commits, and heartbeats report it.
  reserved = cl.c.ReservePlacementVersion(3);
  ASSERT_TRUE(reserved.ok());
  EXPECT_EQ(*reserved, 4);
  next = cl.c.placement();
  next.experts.version = 4;
  next.experts.hosts[1][7] = {0, 1};
  ASSERT_TRUE(cl.c.CommitPlacement(next, 3, cl.now).ok());
  EXPECT_EQ(cl.c.placement(), next);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.Heartbeat(cl.id(0), cl.infos[0].incarnation(), {}, cl.now).placement_version, 4);
}

TEST(CoordinatorTest, WithoutASpareTheClusterIsNotReadyUntilTheNodeReturns) {
  Cluster cl(/*experts=*/2);
  const uint32_t victim = cl.id(3);  // worker 1
  cl.Run(absl::Seconds(2), {victim});
  EXPECT_EQ(StateOf(cl.c, victim), pb::DEAD);
  EXPECT_FALSE(cl.c.ready());
  EXPECT_NE(cl.c.not_ready_reason().find(absl::StrCat("node ", victim)), std::string::npos)
      << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.placement().version(), 1);
  cl.Run(kBeat);
  EXPECT_EQ(StateOf(cl.c, victim), pb::ALIVE);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
}

// Rolls out what PlanResize asks for as the balancer does (reserve, load, commit); false when
// nothing is due.
bool RollOutResize(Cluster& cl, std::string* why = nullptr) {
  std::optional<CoordinatorState::Resize> resize = cl.c.PlanResize(cl.now);
  if (!resize.has_value()) return false;
  if (why != nullptr) *why = resize->why;
  absl::StatusOr<int64_t> version = cl.c.ReservePlacementVersion(resize->base_version);
  EXPECT_TRUE(version.ok()) << version.status();
  resize->placement.experts.version = *version;
  const absl::Status committed =
      cl.c.CommitPlacement(resize->placement, resize->base_version, cl.now);
  EXPECT_TRUE(committed.ok()) << committed;
  return committed.ok();
}

// A node that joins a placed cluster becomes a worker once it has been up for the heartbeat
// timeout plus an interval (a restarted node takes a dead worker's slot first, as a spare).
TEST(CoordinatorTest, AJoiningExpertNodeJoinsThePlacementAfterTheJoinDelay) {
  Cluster cl(/*experts=*/2);
  ASSERT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{cl.id(2), cl.id(3)}));
  cl.Run(absl::Seconds(1));
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
  pb::NodeInfo joiner = Node(pb::ROLE_EXPERT, 4);
  joiner.set_node_id(Join(cl.c, joiner, cl.now));
  cl.infos.push_back(joiner);
  cl.Run(absl::Milliseconds(1500));
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value()) << "too early";
  EXPECT_EQ(cl.c.placement().version(), 1);
  cl.Run(absl::Milliseconds(500));
  std::string why;
  ASSERT_TRUE(RollOutResize(cl, &why));
  EXPECT_NE(why.find(absl::StrCat("node ", joiner.node_id(), " joins")), std::string::npos)
      << why;
  EXPECT_EQ(cl.c.placement().version(), 2);
  EXPECT_EQ(cl.c.placement().worker_nodes,
            (std::vector<uint32_t>{cl.id(2), cl.id(3), joiner.node_id()}));
  ExpectSlices(cl.c.placement().experts, {0, 2, 5, 8});  // 8 experts over 3 x 4 slots
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
}

// A draining worker keeps its experts (and the cluster stays ready) until a placement without it
// is committed; a placement that still names it is refused.
TEST(CoordinatorTest, ADrainingWorkerLeavesThePlacementThroughARollout) {
  Cluster cl(/*experts=*/2, /*replica_slots=*/4);
  const uint32_t drained = cl.id(2);
  const uint32_t survivor = cl.id(3);
  ASSERT_TRUE(cl.c.Drain(drained, cl.now).ok());
  EXPECT_TRUE(cl.c.Heartbeat(drained, cl.infos[2].incarnation(), {}, cl.now).drain);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{drained, survivor}));

  absl::StatusOr<int64_t> version = cl.c.ReservePlacementVersion(1);
  ASSERT_TRUE(version.ok());
  ClusterPlacement stale = cl.c.placement();
  stale.experts.version = *version;
  EXPECT_EQ(cl.c.CommitPlacement(stale, 1, cl.now).code(), absl::StatusCode::kAborted);

  // The survivor's 4 slots cannot hold 8 experts, but with its 4 replica slots they can.
  std::string why;
  ASSERT_TRUE(RollOutResize(cl, &why));
  EXPECT_NE(why.find(absl::StrCat("node ", drained, " drains")), std::string::npos) << why;
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{survivor}));
  EXPECT_GT(cl.c.placement().version(), *version);
  ExpectSlices(cl.c.placement().experts, {0, 8});
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
}

// A drain the other nodes cannot absorb (8 experts, one other node of 4 slots and no replica
// slots) is refused: the node is not marked draining, nothing is planned, the cluster stays
// ready. Once another expert node brings room, the same drain is accepted.
TEST(CoordinatorTest, ADrainWithoutRoomForTheExpertsIsRefused) {
  Cluster cl(/*experts=*/2);
  const absl::Status refused = cl.c.Drain(cl.id(2), cl.now);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("4 slots per MoE layer for 8 experts"), std::string::npos)
      << refused;
  EXPECT_FALSE(cl.c.Heartbeat(cl.id(2), cl.infos[2].incarnation(), {}, cl.now).drain);
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  pb::NodeInfo joiner = Node(pb::ROLE_EXPERT, 4);
  joiner.set_node_id(Join(cl.c, joiner, cl.now));
  EXPECT_TRUE(cl.c.Drain(cl.id(2), cl.now).ok());
}

// Without a live router nobody needs the experts (the launcher stops routers first): a drain is
// accepted whatever the room.
TEST(CoordinatorTest, ADrainWithoutALiveRouterIsAccepted) {
  Cluster cl(/*experts=*/2);
  cl.Run(absl::Seconds(2), {cl.id(1)});  // the router's heartbeats stop
  ASSERT_EQ(StateOf(cl.c, cl.id(1)), pb::DEAD);
  EXPECT_TRUE(cl.c.Drain(cl.id(2), cl.now).ok());
}

// A dead worker whose experts all have live replicas needs no resize: a spare restores them.
TEST(CoordinatorTest, ADeadWorkerWithLiveReplicasIsNotResizedAway) {
  Cluster cl(/*experts=*/2, /*replica_slots=*/4);
  cl.Run(absl::Seconds(2), {cl.id(2)});
  ASSERT_EQ(StateOf(cl.c, cl.id(2)), pb::DEAD);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
}

// The last host of some experts dies and no spare exists: the survivor loads them (a resize) when
// it has the slots, and until then the state says they are being moved.
TEST(CoordinatorTest, ExpertsWhoseLastHostDiedMoveOntoTheSurvivors) {
  Cluster cl(/*experts=*/2, /*replica_slots=*/0, /*slots=*/8);
  const uint32_t victim = cl.id(2);
  const uint32_t survivor = cl.id(3);
  cl.Run(absl::Seconds(2), {victim});
  ASSERT_EQ(StateOf(cl.c, victim), pb::DEAD);
  EXPECT_FALSE(cl.c.ready());
  EXPECT_NE(cl.c.not_ready_reason().find("moving it onto the live expert nodes"),
            std::string::npos)
      << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.lost_experts_reason(), "");
  EXPECT_EQ(cl.c.State().lost_experts_reason(), "");

  // A failed rollout names its cause until the placement moves.
  cl.c.ResizeFailed(1, absl::UnavailableError("node 4 could not map the experts"), cl.now);
  EXPECT_NE(cl.c.lost_experts_reason().find("could not map"), std::string::npos);
  EXPECT_NE(cl.c.State().lost_experts_reason().find("could not map"), std::string::npos);

  std::string why;
  ASSERT_TRUE(RollOutResize(cl, &why));
  EXPECT_NE(why.find(absl::StrCat("dead node ", victim)), std::string::npos) << why;
  EXPECT_EQ(cl.c.placement().worker_nodes, (std::vector<uint32_t>{survivor}));
  ExpectSlices(cl.c.placement().experts, {0, 8});
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.lost_experts_reason(), "");
}

// When the survivors cannot hold the dead worker's experts, the state says why (routers then fail
// the steps that need them, naming it).
// The state names the live workers whose death could not be repaired (no replicas, no spare, no
// room elsewhere), so that routers need not wait for the coordinator to notice.
TEST(CoordinatorTest, UnrecoverableLossesNameTheWorkersNothingCouldReplace) {
  Cluster small(/*experts=*/2);  // 4 slots each, 8 experts, no replicas
  EXPECT_EQ(small.c.unrecoverable_losses().size(), 2u);
  const pb::ClusterState state = small.c.State();
  ASSERT_EQ(state.unrecoverable_losses().count(small.id(2)), 1u);
  EXPECT_NE(state.unrecoverable_losses().at(small.id(2)).find("offer 4 slots per MoE layer"),
            std::string::npos)
      << state.unrecoverable_losses().at(small.id(2));
  // A spare (up, unplaced) would take the slot.
  Join(small.c, Node(pb::ROLE_EXPERT, 4), small.now);
  EXPECT_TRUE(small.c.unrecoverable_losses().empty());

  Cluster roomy(/*experts=*/2, /*replica_slots=*/0, /*slots=*/8);  // the survivor takes all 8
  EXPECT_TRUE(roomy.c.unrecoverable_losses().empty());
  Cluster replicated(/*experts=*/2, /*replica_slots=*/4);  // every expert has two hosts
  EXPECT_TRUE(replicated.c.unrecoverable_losses().empty());
}

TEST(CoordinatorTest, ExpertsThatCannotMoveAreReportedLost) {
  Cluster cl(/*experts=*/2);  // 4 slots each, 8 experts
  const uint32_t victim = cl.id(3);
  cl.Run(absl::Seconds(2), {victim});
  ASSERT_EQ(StateOf(cl.c, victim), pb::DEAD);
  EXPECT_FALSE(cl.c.PlanResize(cl.now).has_value());
  EXPECT_FALSE(cl.c.ready());
  EXPECT_NE(cl.c.lost_experts_reason().find("offer 4 slots"), std::string::npos)
      << cl.c.lost_experts_reason();
  EXPECT_NE(cl.c.not_ready_reason().find(cl.c.lost_experts_reason()), std::string::npos);
  EXPECT_EQ(cl.c.State().lost_experts_reason(), cl.c.lost_experts_reason());
  // It comes back: nothing is lost any more.
  cl.Run(kBeat);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_EQ(cl.c.lost_experts_reason(), "");
}

TEST(CoordinatorTest, HeartbeatsFromStrangersAskThemToRegister) {
  Cluster cl(2);
  const pb::NodeInfo& a = cl.infos[0];
  EXPECT_TRUE(cl.c.Heartbeat(999, 1, {}, cl.now).unknown_node);
  EXPECT_TRUE(cl.c.Heartbeat(a.node_id(), a.incarnation() + 1, {}, cl.now).unknown_node);
  HeartbeatReply ok = cl.c.Heartbeat(a.node_id(), a.incarnation(), {}, cl.now);
  EXPECT_FALSE(ok.unknown_node);
  EXPECT_TRUE(ok.cluster_ready);
  EXPECT_EQ(ok.members_version, cl.c.members_version());

  EXPECT_EQ(cl.c.Leave(a.node_id(), a.incarnation() + 1, cl.now).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(cl.c.Leave(a.node_id(), a.incarnation(), cl.now).ok());
  EXPECT_EQ(StateOf(cl.c, a.node_id()), pb::LEFT);
  EXPECT_FALSE(cl.c.ready());
  EXPECT_TRUE(cl.c.Heartbeat(a.node_id(), a.incarnation(), {}, cl.now).unknown_node);
  // Registering again with its id brings it back.
  EXPECT_EQ(Join(cl.c, a, cl.now), a.node_id());
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
}

TEST(CoordinatorTest, NodeIdsCannotBeStolenFromLiveNodesOrOtherRoles) {
  Cluster cl(2);
  pb::NodeInfo impostor = Node(pb::ROLE_ATTENTION);
  impostor.set_node_id(cl.id(0));  // a different incarnation of a live node
  EXPECT_EQ(TryJoin(cl.c, impostor, cl.now).code(), absl::StatusCode::kAlreadyExists);
  pb::NodeInfo wrong_role = cl.infos[1];
  wrong_role.set_role(pb::ROLE_ATTENTION);
  EXPECT_EQ(TryJoin(cl.c, wrong_role, cl.now).code(), absl::StatusCode::kAlreadyExists);
  // A retried registration of the same process is fine and keeps the id.
  EXPECT_EQ(Join(cl.c, cl.infos[0], cl.now), cl.id(0));
  // Once the holder is dead, a new process of the same role may take the id over.
  cl.Run(absl::Seconds(2), {cl.id(0)});
  ASSERT_EQ(StateOf(cl.c, cl.id(0)), pb::DEAD);
  EXPECT_EQ(Join(cl.c, impostor, cl.now), cl.id(0));
  // Fresh nodes get ids never used before.
  const uint32_t fresh = Join(cl.c, Node(pb::ROLE_ROUTER), cl.now);
  for (const pb::NodeInfo& info : cl.infos) EXPECT_NE(fresh, info.node_id());
}

TEST(CoordinatorTest, DrainIsReportedAndTakesTheNodeOutOfReadiness) {
  Cluster cl(2);
  const pb::NodeInfo& a = cl.infos[0];
  EXPECT_EQ(cl.c.Drain(12345, cl.now).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(cl.c.Drain(a.node_id(), cl.now).ok());
  EXPECT_TRUE(cl.c.Heartbeat(a.node_id(), a.incarnation(), {}, cl.now).drain);
  EXPECT_FALSE(cl.c.ready());
  EXPECT_NE(cl.c.not_ready_reason().find("ROLE_ATTENTION"), std::string::npos);
  Join(cl.c, Node(pb::ROLE_ATTENTION), cl.now);
  EXPECT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
}

TEST(CoordinatorTest, ARestartedCoordinatorRelearnsMembersAndPlacementFromTheNodes) {
  Cluster cl(/*experts=*/3);
  // Make the placement move past version 1 so that adoption is visible.
  cl.Run(absl::Seconds(2), {cl.id(2)});
  ASSERT_EQ(cl.c.placement().version(), 2);
  const ClusterPlacement before = cl.c.placement();
  pb::ExpertPlacement known;
  ClusterPlacementToProto(before, &known);

  // A new coordinator with a recovery window.
  CoordinatorOptions options = Options(2, 8, 2);
  options.recovery_window = absl::Milliseconds(1500);
  const absl::Time restart = cl.now;
  CoordinatorState fresh(options, restart);
  EXPECT_FALSE(fresh.ready());
  EXPECT_EQ(TryJoin(fresh, Node(pb::ROLE_ROUTER), restart).code(), absl::StatusCode::kUnavailable);

  // Live nodes learn they are unknown from their next heartbeat and register with their ids;
  // those acting on a placement send it along.
  for (const pb::NodeInfo& info : cl.infos) {
    if (info.node_id() == cl.id(2)) continue;  // the dead one stays dead
    EXPECT_TRUE(fresh.Heartbeat(info.node_id(), info.incarnation(), {}, restart).unknown_node);
    const bool has_placement = info.role() != pb::ROLE_ATTENTION;
    EXPECT_EQ(Join(fresh, info, restart + kBeat, has_placement ? &known : nullptr),
              info.node_id());
  }
  EXPECT_EQ(fresh.placement(), before);
  EXPECT_FALSE(fresh.ready());  // still inside the window
  fresh.Tick(restart + absl::Milliseconds(1600));
  EXPECT_TRUE(fresh.ready()) << fresh.not_ready_reason();
  EXPECT_EQ(fresh.placement(), before);  // adopted, not recomputed

  // A new node now gets an id no earlier node had, including the dead one.
  const uint32_t id = Join(fresh, Node(pb::ROLE_ROUTER), restart + absl::Milliseconds(1600));
  for (const pb::NodeInfo& info : cl.infos) EXPECT_GT(id, info.node_id());
}

// A coordinator restarted with the flags of a fresh cluster (no recovery window) still relearns
// the cluster: the first node that registers with an id it never handed out starts a window of
// one heartbeat timeout, during which its state says `recovering` and it places nothing anew.
TEST(CoordinatorTest, ARegistrationWithAnUnknownIdStartsRecoveryWithoutAWindow) {
  Cluster cl(/*experts=*/3);
  ASSERT_TRUE(cl.c.ready()) << cl.c.not_ready_reason();
  EXPECT_FALSE(cl.c.State().recovering());
  const ClusterPlacement before = cl.c.placement();
  pb::ExpertPlacement known;
  ClusterPlacementToProto(before, &known);

  CoordinatorState fresh(Options(2, 8, 2), cl.now);  // recovery_window 0
  EXPECT_FALSE(fresh.State().recovering());
  const absl::Time restart = cl.now + absl::Milliseconds(10);
  // Expert nodes first: alone, they would be enough to compute a new placement version 1.
  std::vector<pb::NodeInfo> order;
  for (const pb::NodeInfo& info : cl.infos) {
    if (info.role() == pb::ROLE_EXPERT) order.push_back(info);
  }
  for (const pb::NodeInfo& info : cl.infos) {
    if (info.role() != pb::ROLE_EXPERT) order.push_back(info);
  }
  absl::Time now = restart;
  for (size_t i = 0; i < order.size(); ++i) {
    const pb::NodeInfo& info = order[i];
    const bool has_placement = info.role() != pb::ROLE_ATTENTION;
    EXPECT_EQ(Join(fresh, info, now, has_placement ? &known : nullptr), info.node_id());
    EXPECT_TRUE(fresh.State().recovering()) << "after " << i + 1 << " registrations";
    EXPECT_FALSE(fresh.ready());
    now += absl::Milliseconds(20);
  }
  // A brand-new node must wait: its id could collide with a live node's.
  EXPECT_EQ(TryJoin(fresh, Node(pb::ROLE_ROUTER), now).code(), absl::StatusCode::kUnavailable);
  fresh.Tick(restart + CoordinatorOptions().heartbeat_timeout);
  EXPECT_FALSE(fresh.State().recovering());
  EXPECT_TRUE(fresh.ready()) << fresh.not_ready_reason();
  EXPECT_EQ(fresh.placement(), before);  // adopted, not recomputed
  for (const pb::NodeInfo& info : cl.infos) {
    EXPECT_EQ(StateOf(fresh, info.node_id()), pb::ALIVE) << info.node_id();
  }
}

TEST(CoordinatorTest, AnIncompatibleKnownPlacementIsIgnored) {
  CoordinatorState c(Options(2, 8, 1), kStart);
  ClusterPlacement wrong;
  wrong.experts = *ContiguousPlacement(/*layers=*/3, /*experts=*/8, {8}, /*version=*/7);
  wrong.worker_nodes = {5};
  pb::ExpertPlacement proto;
  ClusterPlacementToProto(wrong, &proto);
  pb::NodeInfo info = Node(pb::ROLE_ROUTER);
  Join(c, info, kStart, &proto);
  EXPECT_FALSE(c.placement().placed());
}

TEST(CoordinatorTest, DenseModelsNeedNoExpertNodes) {
  CoordinatorOptions options = Options(0, 0, 0);
  options.required_roles = {pb::ROLE_ATTENTION};
  CoordinatorState c(options, kStart);
  EXPECT_FALSE(c.ready());
  Join(c, Node(pb::ROLE_ATTENTION), kStart);
  EXPECT_TRUE(c.ready()) << c.not_ready_reason();
  EXPECT_FALSE(c.placement().placed());
}

TEST(ClusterPlacementTest, ProtoRoundTripAndValidation) {
  ClusterPlacement p;
  p.experts = *ContiguousPlacement(2, 6, {1, 2, 3}, /*version=*/4);
  p.experts.hosts[1][0] = {0, 2};  // a replica
  p.worker_nodes = {7, 9, 11};
  pb::ExpertPlacement proto;
  ClusterPlacementToProto(p, &proto);
  EXPECT_EQ(proto.layers(1).experts(0).workers_size(), 2);
  absl::StatusOr<ClusterPlacement> back = ClusterPlacementFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);

  pb::ExpertPlacement bad = proto;
  bad.mutable_worker_node_ids()->RemoveLast();
  EXPECT_EQ(ClusterPlacementFromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = proto;
  bad.set_worker_node_ids(1, 7);
  EXPECT_FALSE(ClusterPlacementFromProto(bad).ok());  // one node as two workers
  bad = proto;
  bad.mutable_layers(0)->mutable_experts(3)->clear_workers();
  EXPECT_FALSE(ClusterPlacementFromProto(bad).ok());  // an expert without a host
  EXPECT_TRUE(ClusterPlacementFromProto(pb::ExpertPlacement()).ok());  // nothing placed yet
}

}  // namespace
}  // namespace k3
