// Online bias: which SetBias calls a load report makes, and pushing them over real gRPC to a
// router stand-in that records them and to an unreachable one.
#include "coordinator/online_bias.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/grpc_server.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

// A report of layers 0..n-1 whose layer l has the QB estimate biases[l] (empty: none).
pb::LoadReport ReportWith(const std::vector<std::vector<float>>& biases) {
  pb::LoadReport report;
  for (size_t l = 0; l < biases.size(); ++l) {
    pb::LayerLoadReport* layer = report.add_layers();
    layer->set_layer(static_cast<int>(l));
    layer->mutable_qb_bias()->Add(biases[l].begin(), biases[l].end());
  }
  return report;
}

std::vector<float> Values(const pb::SetBiasRequest& request) {
  return {request.values().begin(), request.values().end()};
}

TEST(BiasCallsTest, OneCallPerLayerWithAnEstimateAndRouter) {
  const std::vector<NodeAddress> routers = {{4, "a:1"}, {9, "b:2"}};
  const std::vector<BiasCall> calls =
      BiasCalls(ReportWith({{0.5f, -0.5f}, {}, {0.25f, 0.f, -0.25f}}), routers);
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].address, "a:1");
  EXPECT_EQ(calls[1].address, "b:2");
  EXPECT_EQ(calls[2].address, "a:1");
  EXPECT_EQ(calls[3].address, "b:2");
  for (int i : {0, 1}) {
    EXPECT_EQ(calls[i].request.layer(), 0);
    EXPECT_EQ(Values(calls[i].request), (std::vector<float>{0.5f, -0.5f}));
  }
  for (int i : {2, 3}) {
    EXPECT_EQ(calls[i].request.layer(), 2);
    EXPECT_EQ(Values(calls[i].request), (std::vector<float>{0.25f, 0.f, -0.25f}));
  }
  EXPECT_TRUE(BiasCalls(ReportWith({{}, {}}), routers).empty());
  EXPECT_TRUE(BiasCalls(ReportWith({{1.f}}), {}).empty());
}

// Records the SetBias calls it answers.
class Router final : public pb::RouterControl::CallbackService {
 public:
  grpc::ServerUnaryReactor* SetBias(grpc::CallbackServerContext* context,
                                    const pb::SetBiasRequest* request,
                                    pb::SetBiasResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::vector<pb::SetBiasRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<pb::SetBiasRequest> requests_ ABSL_GUARDED_BY(mu_);
};

TEST(PushBiasTest, PushesToEveryRouterAndCountsEachAnswerByCode) {
  Router router;
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {&router});
  ASSERT_TRUE(server.ok()) << server.status();
  // Port 1 refuses connections: a router the coordinator believes alive but cannot reach.
  const std::vector<NodeAddress> routers = {
      {1, absl::StrCat("127.0.0.1:", (*server)->port())}, {2, "127.0.0.1:1"}};
  MetricsRegistry metrics;
  MetricFamily<Counter>& pushes = metrics.AddCounter("pushes", "SetBias calls", {"code"});
  RpcFanOut calls{ClientTls()};

  EXPECT_EQ(PushBias(ReportWith({{}, {}}), routers, absl::Seconds(5), calls, pushes), 0);
  EXPECT_TRUE(router.requests().empty());
  EXPECT_EQ(metrics.ExpositionText().find("pushes{"), std::string::npos);

  EXPECT_EQ(PushBias(ReportWith({{}, {0.125f, -0.125f}}), routers, absl::Seconds(5), calls,
                     pushes),
            2);
  const std::vector<pb::SetBiasRequest> received = router.requests();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].layer(), 1);
  EXPECT_EQ(Values(received[0]), (std::vector<float>{0.125f, -0.125f}));
  EXPECT_EQ(pushes.WithLabels({"OK"})->Value(), 1);
  EXPECT_EQ(pushes.WithLabels({"UNAVAILABLE"})->Value(), 1);
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace k3
