#include "coordinator/online_bias.h"

#include <memory>
#include <utility>

#include "glog/logging.h"
#include "proto/cluster.grpc.pb.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

std::vector<BiasCall> BiasCalls(const pb::LoadReport& report,
                                const std::vector<NodeAddress>& routers) {
  std::vector<BiasCall> calls;
  for (const pb::LayerLoadReport& layer : report.layers()) {
    if (layer.qb_bias().empty()) continue;
    for (const NodeAddress& router : routers) {
      BiasCall call;
      call.address = router.address;
      call.request.set_layer(layer.layer());
      *call.request.mutable_values() = layer.qb_bias();
      calls.push_back(std::move(call));
    }
  }
  return calls;
}

int PushBias(const pb::LoadReport& report, const std::vector<NodeAddress>& routers,
             absl::Duration timeout, RpcFanOut& calls, MetricFamily<Counter>& pushes) {
  const std::vector<BiasCall> bias_calls = BiasCalls(report, routers);
  if (bias_calls.empty()) return 0;
  std::vector<std::string> addresses;
  for (const BiasCall& call : bias_calls) addresses.push_back(call.address);
  std::vector<absl::StatusOr<pb::SetBiasResponse>> answers = calls.CallAll<pb::SetBiasResponse>(
      addresses, timeout,
      [&bias_calls](const std::shared_ptr<grpc::Channel>& channel, size_t i,
                    grpc::ClientContext* context, pb::SetBiasResponse* out,
                    std::function<void(grpc::Status)> done) {
        std::shared_ptr<pb::RouterControl::Stub> stub = pb::RouterControl::NewStub(channel);
        stub->async()->SetBias(context, &bias_calls[i].request, out, std::move(done));
        return std::shared_ptr<void>(stub);
      });
  for (const absl::StatusOr<pb::SetBiasResponse>& answer : answers) {
    pushes.WithLabels({absl::StatusCodeToString(answer.status().code())})->Increment();
    if (!answer.ok()) {
      LOG_EVERY_N(WARNING, 10) << "online bias: SetBias: " << answer.status();
    }
  }
  return static_cast<int>(bias_calls.size());
}

}  // namespace k3
