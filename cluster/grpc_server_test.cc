#include "cluster/grpc_server.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace k3 {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(5);

std::shared_ptr<grpc::Channel> ChannelTo(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

TEST(GrpcServerTest, HealthStartsNotServingAndFollowsSetServing) {
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.health_services = {"k3serve.v1.K3Serve"};
  auto server = GrpcServer::Start(options, {});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  auto channel = ChannelTo((*server)->port());

  EXPECT_EQ(CheckServing(channel, "", kTimeout).value(), false);
  EXPECT_EQ(CheckServing(channel, "k3serve.v1.K3Serve", kTimeout).value(), false);
  EXPECT_EQ(CheckServing(channel, "no.such.Service", kTimeout).status().code(),
            absl::StatusCode::kNotFound);

  (*server)->SetServing("", true);
  EXPECT_EQ(CheckServing(channel, "", kTimeout).value(), true);
  EXPECT_EQ(CheckServing(channel, "k3serve.v1.K3Serve", kTimeout).value(), false);
  (*server)->SetServing("k3serve.v1.K3Serve", true);
  EXPECT_EQ(CheckServing(channel, "k3serve.v1.K3Serve", kTimeout).value(), true);
  (*server)->SetServing("k3serve.v1.K3Serve", false);  // draining
  EXPECT_EQ(CheckServing(channel, "k3serve.v1.K3Serve", kTimeout).value(), false);
  EXPECT_EQ(CheckServing(channel, "", kTimeout).value(), true);

  (*server)->Shutdown(absl::Seconds(1));
  EXPECT_FALSE(CheckServing(channel, "", absl::Milliseconds(500)).ok());
  (*server)->SetServing("", true);  // no effect, no crash
}

TEST(GrpcServerTest, ATakenPortAndABadAddressAreErrors) {
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  auto first = GrpcServer::Start(options, {});
  ASSERT_TRUE(first.ok()) << first.status();
  options.address = absl::StrCat("127.0.0.1:", (*first)->port());
  EXPECT_EQ(GrpcServer::Start(options, {}).status().code(), absl::StatusCode::kUnavailable);
  options.address = "localhost";
  EXPECT_EQ(GrpcServer::Start(options, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrpcServerTest, ShutdownTellsWatchersAndCancelsLongCallsAfterTheGrace) {
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  auto server = GrpcServer::Start(options, {});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetServing("", true);
  auto stub = grpc::health::v1::Health::NewStub(ChannelTo((*server)->port()));

  // Watch never ends by itself: it streams status changes until cancelled.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckRequest request;
  auto reader = stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  std::vector<grpc::health::v1::HealthCheckResponse::ServingStatus> seen;
  std::thread watcher([&] {
    grpc::health::v1::HealthCheckResponse r;
    while (reader->Read(&r)) seen.push_back(r.status());
  });
  const absl::Time start = absl::Now();
  (*server)->Shutdown(absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  watcher.join();
  const grpc::Status finish = reader->Finish();
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_FALSE(finish.ok());  // the stream was cut, not completed
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

}  // namespace
}  // namespace k3
