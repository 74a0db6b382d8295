// Online bias: pushes each MoE layer's centred QB estimate (spec §8, LayerLoadReport.qb_bias of
// the coordinator's load report) to the routers as their new e_score_correction_bias
// (RouterControl.SetBias). CHANGES THE MODEL'S OUTPUTS; the LoadBalancer does it every
// online_bias_interval when that is set (off by default), and restarts its load window after a
// push, since histograms gathered under two biases never merge.
//
// Thread-safety: the functions keep no state; PushBias calls on `calls` (see RpcFanOut).
#ifndef K3SERVE_COORDINATOR_ONLINE_BIAS_H_
#define K3SERVE_COORDINATOR_ONLINE_BIAS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cluster/metrics.h"
#include "coordinator/rpc_fan_out.h"
#include "proto/cluster.pb.h"

namespace k3 {

// One SetBias call: the request and the router it goes to.
struct BiasCall {
  std::string address;
  k3serve::cluster::v1::SetBiasRequest request;
};

// One call per layer of `report` with a QB estimate and per router: the layer's qb_bias as the
// values. Layers without an estimate (too few tokens) are left out.
std::vector<BiasCall> BiasCalls(const k3serve::cluster::v1::LoadReport& report,
                                const std::vector<NodeAddress>& routers);

// Makes the BiasCalls all at once, each within `timeout`, and counts every answer in
// pushes{code} (a counter family labelled by status code name). Returns how many calls were made
// (0: nothing to push, so the routers' bias is unchanged).
int PushBias(const k3serve::cluster::v1::LoadReport& report,
             const std::vector<NodeAddress>& routers, absl::Duration timeout, RpcFanOut& calls,
             MetricFamily<Counter>& pushes);

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_ONLINE_BIAS_H_
