#include "cluster/actor_rpc.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "cluster/test_wait.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace k3 {
namespace {

namespace hpb = grpc::health::v1;

// Health.Check answered on an actor: SERVING for the service "up", NOT_FOUND for any other, the
// way a role's state would answer (read on the actor thread, so recorded there).
class ActorHealth final : public hpb::Health::CallbackService {
 public:
  explicit ActorHealth(Actor* actor) : actor_(actor) {}

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const hpb::HealthCheckRequest* request,
                                  hpb::HealthCheckResponse* response) override {
    grpc::ServerUnaryReactor* reactor = RunOnActor(*actor_, context, [this, request, response] {
      ran_on_actor_ = actor_->IsCurrent();
      saw_handler_return_ = handler_returned_.load();
      if (request->service() != "up") return absl::NotFoundError("no service " + request->service());
      response->set_status(hpb::HealthCheckResponse::SERVING);
      return absl::OkStatus();
    });
    handler_returned_ = true;
    return reactor;
  }

  std::atomic<bool> handler_returned_{false};
  std::atomic<bool> ran_on_actor_{false};
  std::atomic<bool> saw_handler_return_{false};

 private:
  Actor* const actor_;
};

class ActorRpcTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = hpb::Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    actor_.Stop();
  }

  grpc::Status Check(const std::string& service, hpb::HealthCheckResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    hpb::HealthCheckRequest request;
    request.set_service(service);
    return stub_->Check(&context, request, response);
  }

  Actor actor_{"rpc-test"};
  ActorHealth service_{&actor_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<hpb::Health::Stub> stub_;
};

TEST_F(ActorRpcTest, TheActorAnswersTheCallWithItsStatus) {
  hpb::HealthCheckResponse response;
  ASSERT_TRUE(Check("up", &response).ok());
  EXPECT_EQ(response.status(), hpb::HealthCheckResponse::SERVING);
  EXPECT_TRUE(service_.ran_on_actor_);

  const grpc::Status missing = Check("down", &response);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_message(), "no service down");
}

TEST_F(ActorRpcTest, TheHandlerReturnsBeforeABusyActorRunsTheWork) {
  absl::Notification release;
  actor_.Post([&release] { release.WaitForNotification(); });

  hpb::HealthCheckResponse response;
  grpc::ClientContext context;
  hpb::HealthCheckRequest request;
  request.set_service("up");
  absl::Notification done;
  grpc::Status status;
  stub_->async()->Check(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // A handler that waited for the actor would still be inside Check here.
  EXPECT_TRUE(WaitFor([&] { return service_.handler_returned_.load(); }));
  EXPECT_FALSE(done.HasBeenNotified());
  release.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(service_.saw_handler_return_);
  EXPECT_EQ(response.status(), hpb::HealthCheckResponse::SERVING);
}

TEST_F(ActorRpcTest, AStoppedActorEndsTheCallUnavailable) {
  actor_.Stop();
  hpb::HealthCheckResponse response;
  const grpc::Status status = Check("up", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status.error_message(), "actor rpc-test is stopping");
  EXPECT_FALSE(service_.ran_on_actor_);
}

}  // namespace
}  // namespace k3
