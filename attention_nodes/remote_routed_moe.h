// RemoteRoutedMoe: the routed experts reached across the router tier. Each MoE layer of a step goes
// to one router as a MoeRequest (moe/moe_wire.h) over the data-plane Transport; Wait blocks on
// the transport until the MoeResponse with the same step id arrives.
//
// Router choice: round-robin over the usable routers, one pick per MoE layer call, so the layers of
// one step spread over every router (routers keep no state between layers). The usable set is what
// the owner last gave SetRouters (in practice: ALIVE routers of the cluster state whose transport
// link is up), minus routers this object saw fail since.
//
// Failures:
//  - the router answers with a non-OK status (e.g. UNAVAILABLE "expert worker node 5 (...) lost"):
//    Wait returns that code with the router's message, prefixed with "router <id>: ";
//  - the router fails (kPeerFailed) while it owes the answer: the rows are sent again to the next
//    usable router (x is still valid then); with no router left Wait returns UNAVAILABLE with the
//    transport's description of the failure;
//  - no answer within `timeout` of Begin: DEADLINE_EXCEEDED naming the router and the layer.
// After a failed Wait the step is abandoned: answers that arrive later carry a step id nobody
// waits for and are dropped. Step ids are unique in the process.
//
// The Transport's Receive is driven only from Wait, so this object must be the only receiver on
// its Transport (an attention worker receives nothing but MoE answers).
//
// Thread-safety: Begin and Wait from one thread at a time (RoutedMoe's contract); SetRouters and
// usable_routers from any thread.
#ifndef K3SERVE_ATTENTION_NODES_REMOTE_ROUTED_MOE_H_
#define K3SERVE_ATTENTION_NODES_REMOTE_ROUTED_MOE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/transport.h"
#include "model/config.h"
#include "moe/routed_moe.h"

namespace k3 {

struct RemoteRoutedMoeOptions {
  // How long Wait waits for a layer's answer, counted from Begin. Longer than the router's own
  // expert deadline, so that a lost expert worker is reported by the router with its name.
  absl::Duration timeout = absl::Seconds(10);
  // Called (on the stepping thread; must be quick) when a router is seen to fail (a kPeerFailed
  // event, or a Send refused with UNAVAILABLE), e.g. to stop linking it. Optional; may be called
  // more than once for one router.
  std::function<void(PeerId, const absl::Status&)> on_router_failed;
};

class RemoteRoutedMoe final : public RoutedMoe {
 public:
  // `transport` must outlive this object; routers are PeerIds already Connected on it.
  RemoteRoutedMoe(Transport* transport, const ModelConfig& config,
                  RemoteRoutedMoeOptions options = RemoteRoutedMoeOptions());

  RemoteRoutedMoe(const RemoteRoutedMoe&) = delete;
  RemoteRoutedMoe& operator=(const RemoteRoutedMoe&) = delete;

  // Replaces the usable routers (order is the round-robin order).
  void SetRouters(std::vector<PeerId> routers);
  int usable_routers() const;

  absl::Status Begin(int layer, const float* x, int64_t tokens) override;
  absl::Status Wait(float* out) override;

  // Answers dropped because no step waited for them (late answers of abandoned steps).
  uint64_t stale_answers() const { return stale_answers_; }

 private:
  // Sends the current layer's rows, under a fresh step id, to the next usable router; routers
  // whose Send fails are dropped from the set. UNAVAILABLE when none takes them.
  absl::Status SendToNextRouter();
  void DropRouter(PeerId router);

  Transport* const transport_;
  const int hidden_size_;
  const int expert_width_;
  const RemoteRoutedMoeOptions options_;

  mutable absl::Mutex mu_;
  std::vector<PeerId> routers_ ABSL_GUARDED_BY(mu_);

  // Stepping thread only.
  uint64_t next_router_ = 0;
  bool in_flight_ = false;
  int layer_ = -1;
  const float* x_ = nullptr;
  int64_t tokens_ = 0;
  uint64_t step_id_ = 0;
  PeerId router_ = 0;
  absl::Time deadline_;
  uint64_t stale_answers_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_REMOTE_ROUTED_MOE_H_
