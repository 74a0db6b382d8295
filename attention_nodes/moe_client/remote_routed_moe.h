// RemoteRoutedMoe: the routed experts reached across the router tier. Each MoE layer of a step goes
// to one router as a MoeRequest (moe/moe_wire.h) over the data-plane Transport; Wait blocks on
// the transport until the MoeResponse with the same step id arrives.
//
// Router choice: round-robin over the usable routers, one pick per MoE layer call, so the layers of
// one step spread over every router (routers keep no state between layers). The usable set is what
// the owner last gave SetRouters (in practice: ALIVE routers of the cluster state whose transport
// link is up), minus routers this object saw fail since.
//
// Failures: a layer step is a pure function of its rows, and the rows stay valid until its Wait,
// so a layer outlives any one router or expert worker: it is sent again, under a new step id,
// until some attempt answers or `timeout` (counted from Begin) passes.
//  - the router answers with a non-OK status. UNAVAILABLE (e.g. "expert worker node 5 (...) lost"
//    with no other host of its experts), ABORTED (the router cannot serve the layer for a reason
//    of its own, e.g. it has just started) and DEADLINE_EXCEEDED are passing: the rows go to an
//    untried router at once, else again to one that failed after a back-off (100 ms doubling to
//    1 s), so a restarted expert worker or router takes the layer once it is back. Any other code
//    fails the layer at once. At the timeout Wait returns the last error's code and message,
//    prefixed with "router <id>: ";
//  - the router fails (kPeerFailed) while it owes the answer: the rows are sent again to the next
//    usable router, or, with none, to the first router the owner lists again (a restarted one);
//  - the router hangs (a stopped or stuck process: no failure, no answer). Once the step deadline
//    passes without an answer (see RemoteRoutedMoeOptions: a multiple of the measured p99 round
//    trip, with a floor) the rows are sent again to another usable router, and the first answer
//    of any attempt is taken. The late router is suspect: new layers go to the others until any
//    answer of it arrives (its late answers of abandoned steps, once it runs again). The same
//    happens at once when the owner's SetRouters no longer lists the router a step waits for (e.g.
//    the coordinator's DEAD verdict); a router listed again (resumed, restarted) gets the rows
//    again when no other attempt is live;
//  - no router usable at all (at Begin or later): the layer waits for SetRouters to list one;
//  - no answer from any attempt within `timeout` of Begin: the last router error as above, else
//    DEADLINE_EXCEEDED naming the routers and the layer.
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
  // How long a layer may take, retries included, counted from Begin: how long the sequences of a
  // step wait for a router or expert worker to come back (restarted, resumed) before the step
  // fails. Longer than the router's own expert deadline, so that a lost expert worker is
  // reported by the router with its name.
  absl::Duration timeout = absl::Seconds(30);
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
    // Its router was seen unlisted since: its answer is still taken, but it no longer counts as
    // live, so the rows may go to that router again once it is listed again.
    bool orphaned = false;
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
    // With no live attempt: when to send the rows again (a back-off after error answers).
    absl::Time resend_at;
    int error_answers = 0;
    absl::Status last_error;  // the last router error or failure, reported at the timeout
    // Its outcome, once known: the MoeResponse message whose rows (at rows_offset) Wait reads in
    // place, or why there is none.
    bool done = false;
    absl::Status result;
    MessageBytes answer;
    size_t rows_offset = 0;
  };

  // Sends the layer's rows, under a fresh step id, to the next usable router without a live
  // attempt of it, preferring untried routers, then routers that are not suspect; routers whose
  // Send fails are dropped from the set. UNAVAILABLE when none takes them.
  absl::Status SendToNextRouter(InFlight& layer);
  // Sends the layer to another router when its last attempt's router is late or no longer
  // usable, or again when it has no live attempt and its back-off passed (see the file comment).
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
  static bool HasLiveAttempt(const InFlight& layer);

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
