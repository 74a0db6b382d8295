// RpcFanOut over real gRPC on localhost: expert-worker stand-ins that answer with their own id or
// hold the call until it is cancelled.
#include "coordinator/rpc_fan_out.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_server.h"
#include "cluster/test_wait.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

// Ends only when the client cancels the call or its deadline passes.
class HeldCall final : public grpc::ServerUnaryReactor {
 public:
  void OnCancel() override { Finish(grpc::Status(grpc::CANCELLED, "cancelled")); }
  void OnDone() override { delete this; }
};

// LoadExperts answers placement_version = its id, or (holding) never answers at all.
class Worker final : public pb::ExpertWorker::CallbackService {
 public:
  Worker(int64_t id, bool holding) : id_(id), holding_(holding) {}

  grpc::ServerUnaryReactor* LoadExperts(grpc::CallbackServerContext* context,
                                        const pb::LoadExpertsRequest*,
                                        pb::LoadExpertsResponse* response) override {
    ++calls;
    if (holding_) return new HeldCall();
    response->set_placement_version(id_);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::atomic<int> calls{0};

 private:
  const int64_t id_;
  const bool holding_;
};

class RpcFanOutTest : public testing::Test {
 protected:
  // Serves `worker` on a free port; returns its address.
  std::string Serve(Worker* worker) {
    GrpcServerOptions options;
    options.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {worker});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "127.0.0.1:1";
    servers_.push_back(*std::move(server));
    return absl::StrCat("127.0.0.1:", servers_.back()->port());
  }

  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> LoadAll(
      const std::vector<std::string>& addresses, absl::Duration timeout) {
    const pb::LoadExpertsRequest request;
    return fan_out_.CallAll<pb::LoadExpertsResponse>(
        addresses, timeout,
        [&request](const std::shared_ptr<grpc::Channel>& channel, size_t,
                   grpc::ClientContext* context, pb::LoadExpertsResponse* response,
                   std::function<void(grpc::Status)> done) {
          std::shared_ptr<pb::ExpertWorker::Stub> stub = pb::ExpertWorker::NewStub(channel);
          stub->async()->LoadExperts(context, &request, response, std::move(done));
          return std::shared_ptr<void>(stub);
        });
  }

  void TearDown() override {
    fan_out_.Stop();  // ends held calls before their servers go
    for (auto& server : servers_) server->Shutdown(absl::ZeroDuration());
  }

  RpcFanOut fan_out_{ClientTls()};
  std::vector<std::unique_ptr<GrpcServer>> servers_;
};

TEST_F(RpcFanOutTest, AnswersInTheOrderOfTheAddressesAndNamesTheOneThatFailed) {
  Worker seven(7, false);
  Worker nine(9, false);
  // Port 1 refuses connections.
  const std::vector<std::string> called = {Serve(&seven), "127.0.0.1:1", Serve(&nine)};
  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> answers = LoadAll(called, absl::Seconds(5));
  ASSERT_EQ(answers.size(), 3u);
  ASSERT_TRUE(answers[0].ok()) << answers[0].status();
  EXPECT_EQ(answers[0]->placement_version(), 7);
  EXPECT_EQ(answers[1].status().code(), absl::StatusCode::kUnavailable) << answers[1].status();
  EXPECT_NE(answers[1].status().message().find("127.0.0.1:1: "), std::string::npos)
      << answers[1].status();
  ASSERT_TRUE(answers[2].ok()) << answers[2].status();
  EXPECT_EQ(answers[2]->placement_version(), 9);

  // Again over the kept channels: one more call each.
  answers = LoadAll({called[2], called[0]}, absl::Seconds(5));
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0]->placement_version(), 9);
  EXPECT_EQ(answers[1]->placement_version(), 7);
  EXPECT_EQ(seven.calls, 2);
  EXPECT_EQ(nine.calls, 2);
  EXPECT_TRUE(LoadAll({}, absl::Seconds(1)).empty());
}

TEST_F(RpcFanOutTest, ACallPastItsDeadlineEndsWithoutHoldingUpTheOthers) {
  Worker held(1, true);
  Worker quick(2, false);
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> answers =
      LoadAll({Serve(&held), Serve(&quick)}, absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kDeadlineExceeded)
      << answers[0].status();
  ASSERT_TRUE(answers[1].ok()) << answers[1].status();
  EXPECT_EQ(answers[1]->placement_version(), 2);
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(RpcFanOutTest, StopCancelsTheCallsInFlightAndRefusesLaterOnes) {
  Worker held(1, true);
  const std::string address = Serve(&held);
  std::vector<absl::StatusOr<pb::LoadExpertsResponse>> answers;
  std::thread caller([&] { answers = LoadAll({address}, absl::Seconds(60)); });
  ASSERT_TRUE(WaitFor([&] { return held.calls == 1; }));
  EXPECT_FALSE(fan_out_.stopped());
  const absl::Time start = absl::Now();
  fan_out_.Stop();
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kCancelled) << answers[0].status();
  EXPECT_TRUE(fan_out_.stopped());

  answers = LoadAll({address, address}, absl::Seconds(60));
  ASSERT_EQ(answers.size(), 2u);
  for (const auto& answer : answers) {
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kUnavailable) << answer.status();
  }
  EXPECT_EQ(held.calls, 1) << "a call was made after Stop";
}

TEST(AliveMembersTest, TakesTheAliveMembersOfTheRoleInOrder) {
  pb::ClusterState state;
  auto add = [&state](uint32_t id, pb::Role role, pb::MemberState member_state) {
    pb::Member* m = state.add_members();
    m->mutable_node()->set_node_id(id);
    m->mutable_node()->set_role(role);
    m->mutable_node()->set_grpc_address(absl::StrCat("host", id, ":1"));
    m->set_state(member_state);
  };
  add(4, pb::ROLE_ROUTER, pb::ALIVE);
  add(2, pb::ROLE_EXPERT, pb::ALIVE);
  add(3, pb::ROLE_ROUTER, pb::DEAD);
  add(1, pb::ROLE_ROUTER, pb::ALIVE);
  add(5, pb::ROLE_ROUTER, pb::LEFT);
  const std::vector<NodeAddress> routers = AliveMembers(state, pb::ROLE_ROUTER);
  ASSERT_EQ(routers.size(), 2u);
  EXPECT_EQ(routers[0].node, 4u);
  EXPECT_EQ(routers[1].node, 1u);
  EXPECT_EQ(Addresses(routers), (std::vector<std::string>{"host4:1", "host1:1"}));
}

}  // namespace
}  // namespace k3
