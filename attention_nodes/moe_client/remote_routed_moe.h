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
//    Wait returns that code with the router's message, prefixed with "router <id>: ". ABORTED
//    means the router cannot serve the layer for a reason of its own (e.g. it has just started
//    and is not yet connected to an expert worker): the rows go to the next untried router first,
//    and the error stands only when none is left;
//  - the router fails (kPeerFailed) while it owes the answer: the rows are sent again to the next
//    usable router (x is still valid then); with no router left Wait returns UNAVAILABLE with the
//    transport's description of the failure;
//  - the router hangs (a stopped or stuck process: no failure, no answer). A MoE layer step is a
//    pure function of its rows, so once the step deadline passes without an answer (see
//    RemoteRoutedMoeOptions: a multiple of the measured p99 round trip, with a floor) the rows are
//    sent again, under a new step id, to another usable router, and the first answer of any
//    attempt is taken. The late router is suspect: new layers go to the others until any answer
//    of it arrives (its late answers of abandoned steps, once it runs again). The same happens at
//    once when the owner's SetRouters no longer lists the router a step waits for (e.g. the
//    coordinator's DEAD verdict);
//  - no answer from any attempt within `timeout` of Begin: DEADLINE_EXCEEDED naming the routers
//    and the layer.
// After a failed Wait the step is abandoned: answers that arrive later carry a step id nobody
// waits for and are dropped. Step ids are unique in the process.
//
// Ping-pong: up to kConcurrency layers (of different micro-batches) may be in flight at once, each
// with its own attempts, deadlines and retries; an answer that arrives for a later layer while an
// earlier one is waited for is kept until its Wait. A failed Begin or Wait abandons them all.
//
// The Transport's Receive is driven only from Wait, so this object must be the only receiver on
// its Transport while layers are in flight (an attention worker receives nothing but MoE
// answers); a GPU attention worker's RemoteDeviceExperts receives on it between them and hands
// over what is not its own (Deliver).
//
// Thread-safety: Begin and Wait from one thread at a time (RoutedMoe's contract); SetRouters and
// usable_routers from any thread.
#ifndef K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_ROUTED_MOE_H_
#define K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_ROUTED_MOE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/retry_deadline.h"
#include "cluster/transport.h"
#include "model/config.h"
#include "moe/routed_moe.h"

namespace k3 {

struct RemoteRoutedMoeOptions {
  // How long Wait waits for a layer's answer, counted from Begin. Longer than the router's own
  // expert deadline, so that a lost expert worker is reported by the router with its name.
  absl::Duration timeout = absl::Seconds(10);
  // The step deadline after which a layer is sent again to another router (see the file
  // comment): max(retry_floor, retry_p99_factor x the p99 round trip of the last answered
  // layers). The floor keeps noise on a loaded machine from causing retries; an early retry costs
  // only duplicate work (e.g. a prefill chunk far larger than the layers measured may be computed
  // twice).
  absl::Duration retry_floor = absl::Milliseconds(500);
  double retry_p99_factor = 8;
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

  // Layers in flight at once: one per micro-batch of a ping-pong step.
  static constexpr int kConcurrency = 2;

  absl::Status Begin(int layer, const float* x, int64_t tokens) override;
  absl::Status Wait(float* out) override;
  int Concurrency() const override { return kConcurrency; }
  void Abandon() override { in_flight_.clear(); }
  void SetTraces(std::vector<TraceContext> traces) override { traces_ = std::move(traces); }

  // Applies one received event to the layers in flight. Wait calls it for what it receives;
  // another receiver on the same Transport (RemoteDeviceExperts) calls it for the events that are
  // not its own, while no layer of this object is in flight. Stepping thread.
  void Deliver(Received received);

  // Answers dropped because no step waited for them (late answers of abandoned steps).
  uint64_t stale_answers() const { return stale_answers_; }
  // Layers sent again to another router because theirs hung or was declared gone, since start.
  // Any thread.
  uint64_t retries() const { return retries_.load(std::memory_order_relaxed); }
  // The current step deadline (see RemoteRoutedMoeOptions). Stepping thread.
  absl::Duration step_deadline() const { return step_deadline_.deadline(); }

 private:
  struct Attempt {
    uint64_t step_id = 0;
    PeerId router = 0;
    absl::Time sent;
  };

  // A layer begun and not yet waited for.
  struct InFlight {
    int layer = -1;
    const float* x = nullptr;
    int64_t tokens = 0;
    std::vector<Attempt> attempts;  // attempts that may still answer
    std::vector<PeerId> tried;      // every router the layer was sent to
    bool last_superseded = false;   // the last attempt was already followed by a retry decision
    absl::Time deadline;            // Begin + timeout
    absl::Time retry_at;            // the last attempt's step deadline
    // Its outcome, once known: the MoeResponse message whose rows (at rows_offset) Wait reads in
    // place, or why there is none.
    bool done = false;
    absl::Status result;
    MessageBytes answer;
    size_t rows_offset = 0;
  };

  // Sends the layer's rows, under a fresh step id, to the next usable router it has not tried,
  // preferring routers that are not suspect; routers whose Send fails are dropped from the set.
  // UNAVAILABLE when none takes them.
  absl::Status SendToNextRouter(InFlight& layer);
  // Sends the layer to another router when its last attempt's router is late or no longer
  // usable (see the file comment).
  void MaybeRetry(InFlight& layer, absl::Time now);
  // Receives until the oldest layer's outcome is known, settling later layers' on the way.
  void AwaitOldest();
  // A router's process died: its attempts go, and layers left with none go to another router.
  void OnRouterFailed(PeerId from, const absl::Status& error);
  // `from` answered one of `layer`'s attempts (already removed) with an error.
  void OnErrorAnswer(InFlight& layer, PeerId from, const absl::Status& status);
  void Settle(InFlight& layer, absl::Status result);
  void DropRouter(PeerId router);
  bool Usable(PeerId router) const;

  Transport* const transport_;
  const int hidden_size_;
  const int expert_width_;
  const RemoteRoutedMoeOptions options_;

  mutable absl::Mutex mu_;
  std::vector<PeerId> routers_ ABSL_GUARDED_BY(mu_);

  // Stepping thread only.
  uint64_t next_router_ = 0;
  std::deque<InFlight> in_flight_;  // oldest first
  std::vector<TraceContext> traces_;  // sent with every MoeRequest (SetTraces)
  std::set<PeerId> suspects_;       // late routers that have not answered since
  uint64_t stale_answers_ = 0;
  RetryDeadline step_deadline_;  // from the answered layers' round trips
  std::atomic<uint64_t> retries_{0};
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_MOE_CLIENT_REMOTE_ROUTED_MOE_H_
