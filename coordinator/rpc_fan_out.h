// RpcFanOut: the coordinator's unary RPCs to many nodes at once (gathering load statistics,
// LoadExperts of a rollout, SetBias). CallAll starts one call per address, each with the same
// deadline, and returns when every call ended: answered, failed, past its deadline, or cancelled
// by Stop. So one slow or unreachable node costs a round at most its timeout, not the sum.
//
// Channels are made on first use of an address (with the ClientTls given) and kept: routers and
// expert nodes are called again every round.
//
// Thread-safety: CallAll from one thread at a time (the LoadBalancer's actor); Stop from any
// thread. After Stop, calls in flight end CANCELLED and later CallAlls UNAVAILABLE at once.
#ifndef K3SERVE_COORDINATOR_RPC_FAN_OUT_H_
#define K3SERVE_COORDINATOR_RPC_FAN_OUT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/grpc_status.h"
#include "cluster/security.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "proto/cluster.pb.h"

namespace k3 {

// A member to call: its node id (for messages) and gRPC address.
struct NodeAddress {
  uint32_t node = 0;
  std::string address;
};

// The ALIVE members of `role` in `state`, in the state's order.
std::vector<NodeAddress> AliveMembers(const k3serve::cluster::v1::ClusterState& state,
                                      k3serve::cluster::v1::Role role);
std::vector<std::string> Addresses(const std::vector<NodeAddress>& nodes);

class RpcFanOut {
 public:
  explicit RpcFanOut(ClientTls tls) : tls_(std::move(tls)) {}
  RpcFanOut(const RpcFanOut&) = delete;
  RpcFanOut& operator=(const RpcFanOut&) = delete;

  // Starts one call per address with start(channel, index, context, response, done), which
  // starts the call (on gRPC's callback API, finishing with done) and returns whatever must live
  // until the call ends (its stub). Returns the answers in the order of `addresses`; a failed
  // call's status names its address.
  template <typename Response, typename Start>
  std::vector<absl::StatusOr<Response>> CallAll(const std::vector<std::string>& addresses,
                                                absl::Duration timeout, Start start);

  // Cancels the calls in flight; every later CallAll answers UNAVAILABLE. Idempotent.
  void Stop();
  // Whether Stop was called: the coordinator is stopping.
  bool stopped() const;

 private:
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  const ClientTls tls_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // CallAll's thread only

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);  // cancelled by Stop
};

template <typename Response, typename Start>
std::vector<absl::StatusOr<Response>> RpcFanOut::CallAll(const std::vector<std::string>& addresses,
                                                         absl::Duration timeout, Start start) {
  struct Call {
    grpc::ClientContext context;
    Response response;
    absl::Status status;
    std::shared_ptr<void> keep;
  };
  // Shared with the callbacks, which may still be returning when the last one woke us.
  struct Shared {
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::unique_ptr<Call>> calls;
  };
  auto shared = std::make_shared<Shared>();
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < addresses.size(); ++i) {
    shared->calls.push_back(std::make_unique<Call>());
    shared->calls.back()->context.set_deadline(absl::ToChronoTime(deadline));
  }
  std::vector<absl::StatusOr<Response>> results;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      results.assign(addresses.size(), absl::UnavailableError("the coordinator is stopping"));
      return results;
    }
    for (auto& call : shared->calls) in_flight_.insert(&call->context);
  }
  {
    absl::MutexLock lock(&shared->mu);
    shared->remaining = addresses.size();
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    Call* call = shared->calls[i].get();
    call->keep = start(ChannelTo(addresses[i]), i, &call->context, &call->response,
                       [shared, call](grpc::Status status) {
                         call->status = FromGrpcStatus(status);
                         absl::MutexLock lock(&shared->mu);
                         --shared->remaining;
                       });
  }
  {
    absl::MutexLock lock(&shared->mu);
    auto done = [&shared]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared->mu) { return shared->remaining == 0; };
    shared->mu.Await(absl::Condition(&done));
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& call : shared->calls) in_flight_.erase(&call->context);
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    Call& call = *shared->calls[i];
    if (call.status.ok()) {
      results.push_back(std::move(call.response));
    } else {
      results.push_back(absl::Status(call.status.code(),
                                     absl::StrCat(addresses[i], ": ", call.status.message())));
    }
  }
  return results;
}

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_RPC_FAN_OUT_H_
