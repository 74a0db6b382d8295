// RpcFanOut: the coordinator's unary RPCs to many nodes at once (gathering load statistics,
// LoadExperts of a rollout, SetBias). CallAll starts one call per address, each with the same
// deadline, and returns when every call ended: answered, failed, past its deadline, or cancelled
// by Stop. So one slow or unreachable node costs a round at most its timeout, not the sum.
//
// Channels are made on first use of an address (with the ClientTls given) and kept: routers and
// expert nodes are called again every round.
//
// Thread-safety: CallAll and CallAllThen from one thread at a time (the LoadBalancer's actor);
// Stop from any thread. After Stop, calls in flight end CANCELLED and later CallAlls UNAVAILABLE
// at once.
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
#include "absl/synchronization/notification.h"
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

  // CallAll without waiting: returns at once, and `done` gets the answers when every call ended,
  // on the gRPC thread of the last one (at once on this thread when there is no address or after
  // Stop), so it must be quick (e.g. post them to an actor). `start` is called before this
  // returns; what the calls read (their requests) must live in what it returns. Returns a
  // function that cancels the calls still in flight (they end CANCELLED), from any thread, any
  // time, also after `done`.
  template <typename Response, typename Start>
  std::function<void()> CallAllThen(
      const std::vector<std::string>& addresses, absl::Duration timeout, Start start,
      std::function<void(std::vector<absl::StatusOr<Response>>)> done);

  // Cancels the calls in flight and waits until every fan-out's `done` returned; every later
  // CallAll answers UNAVAILABLE. Idempotent. Not from a `done`.
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
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // fan-outs whose `done` has not returned
};

template <typename Response, typename Start>
std::function<void()> RpcFanOut::CallAllThen(
    const std::vector<std::string>& addresses, absl::Duration timeout, Start start,
    std::function<void(std::vector<absl::StatusOr<Response>>)> done) {
  struct Call {
    grpc::ClientContext context;
    Response response;
    absl::Status status;
    std::shared_ptr<void> keep;
  };
  // Shared with the callbacks and the canceller.
  struct Shared {
    absl::Mutex mu;
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::unique_ptr<Call>> calls;
    std::vector<std::string> addresses;
    std::function<void(std::vector<absl::StatusOr<Response>>)> done;
  };
  auto shared = std::make_shared<Shared>();
  shared->addresses = addresses;
  shared->done = std::move(done);
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < addresses.size(); ++i) {
    shared->calls.push_back(std::make_unique<Call>());
    shared->calls.back()->context.set_deadline(absl::ToChronoTime(deadline));
  }
  // Runs once, after the last call ended: the answers to `done`, then this fan-out is over.
  auto finish = [this, shared] {
    {
      absl::MutexLock lock(&mu_);
      for (auto& call : shared->calls) in_flight_.erase(&call->context);
    }
    std::vector<absl::StatusOr<Response>> results;
    for (size_t i = 0; i < shared->calls.size(); ++i) {
      Call& call = *shared->calls[i];
      if (call.status.ok()) {
        results.push_back(std::move(call.response));
      } else {
        results.push_back(absl::Status(
            call.status.code(), absl::StrCat(shared->addresses[i], ": ", call.status.message())));
      }
    }
    shared->done(std::move(results));
    absl::MutexLock lock(&mu_);
    --outstanding_;
  };
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    stopped = stopped_;
    if (!stopped) {
      for (auto& call : shared->calls) in_flight_.insert(&call->context);
      ++outstanding_;
    }
  }
  if (stopped) {
    shared->done(std::vector<absl::StatusOr<Response>>(
        addresses.size(), absl::UnavailableError("the coordinator is stopping")));
    return [] {};
  }
  if (addresses.empty()) {
    finish();
    return [] {};
  }
  {
    absl::MutexLock lock(&shared->mu);
    shared->remaining = addresses.size();
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    Call* call = shared->calls[i].get();
    call->keep = start(ChannelTo(addresses[i]), i, &call->context, &call->response,
                       [shared, call, finish](grpc::Status status) {
                         call->status = FromGrpcStatus(status);
                         {
                           absl::MutexLock lock(&shared->mu);
                           if (--shared->remaining != 0) return;
                         }
                         finish();
                       });
  }
  return [shared] {
    for (auto& call : shared->calls) call->context.TryCancel();
  };
}

template <typename Response, typename Start>
std::vector<absl::StatusOr<Response>> RpcFanOut::CallAll(const std::vector<std::string>& addresses,
                                                         absl::Duration timeout, Start start) {
  absl::Notification finished;
  std::vector<absl::StatusOr<Response>> results;
  CallAllThen<Response>(addresses, timeout, std::move(start),
                        [&](std::vector<absl::StatusOr<Response>> answers) {
                          results = std::move(answers);
                          finished.Notify();
                        });
  finished.WaitForNotification();
  return results;
}

}  // namespace k3

#endif  // K3SERVE_COORDINATOR_RPC_FAN_OUT_H_
