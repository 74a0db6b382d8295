// PendingSteps: the router's table of MoE layer steps in flight. Several attention workers may have
// steps of several layers in flight at once; each step waits for one ExpertResponse from every
// worker slot it sent rows to. Each ExpertRequest carries SlotRequestId(step id, slot), which the
// expert worker echoes: an answer finds its slot exactly, even when one node owes a step several
// slots (its own and a dead or slow node's sent to it again) or answers a slot that has since
// gone to a replica.
//
// Pure bookkeeping (no transport, no clock): the router feeds it answers, failures and the time, and
// sends what comes out. Thread-compatible (the router's loop thread owns it).
#ifndef K3SERVE_ROUTER_PENDING_STEPS_H_
#define K3SERVE_ROUTER_PENDING_STEPS_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/message_bytes.h"
#include "base/trace_context.h"
#include "cluster/transport.h"
#include "moe/moe_wire.h"
#include "router/router_step.h"

namespace k3 {

struct PendingStep {
  uint64_t id = 0;           // the router's step id, carried by its ExpertRequests
  PeerId origin = 0;         // the attention peer that asked
  uint64_t origin_step = 0;  // its MoeRequest's step id, echoed in the MoeResponse
  int model_layer = 0;
  absl::Time start;
  // When the next look at the step is due: the expert deadline (router/router_core.h), at most
  // `timeout_at`.
  absl::Time deadline;
  absl::Time timeout_at;   // the step timeout: late workers count as lost
  absl::Time dispatched;   // when its ExpertRequests went out
  bool resent = false;     // some rows went again to a replica (its time is no round trip)
  // The encoded MoeRequest: planned again from scratch when rows find no live host (a lost
  // expert the coordinator is moving, router/router_core.h).
  MessageBytes request;
  RouterStep step;
  // Per worker slot: the node the rows went to (0: the slot got no rows), and its answer: the
  // ExpertResponse message, whose partial sums are read in place (Partial).
  std::vector<PeerId> nodes;
  std::vector<MessageBytes> answers;
  std::vector<size_t> partial_at;  // where in answers[slot] the partial sums start
  std::vector<bool> answered;
  int outstanding = 0;  // slots with rows and no answer yet

  // Makes room for one more slot's answer.
  void AddSlot();
  // The partial sums slot `slot` answered: [plan.workers[slot].tokens.size(), width]; null when
  // the slot has no answer (it got no rows).
  const float* Partial(size_t slot) const;
  // Per worker slot, optional: the encoded ExpertRequest, kept to send again to a replica when
  // the node dies or hangs (router/router_core.h); empty when not kept.
  std::vector<std::string> requests;
  // Traced steps: the requests' trace contexts (each under its attention step span) and this
  // step's own span, under which the ExpertRequests go.
  std::vector<TraceContext> traces;
  std::array<uint8_t, 8> span_id{};
};

// The step id an ExpertRequest for `slot` of step `step_id` carries (and its answer echoes).
inline constexpr int kSlotBits = 20;
inline constexpr size_t kMaxSlots = size_t{1} << kSlotBits;
inline uint64_t SlotRequestId(uint64_t step_id, size_t slot) {
  return (step_id << kSlotBits) | static_cast<uint64_t>(slot);
}

class PendingSteps {
 public:
  enum class Outcome {
    kDropped,   // no step waits for this answer (it ended already, or the node owes it nothing)
    kWaiting,   // recorded; other workers still owe answers
    kComplete,  // every answer is in: the step left the table
    kFailed,    // the worker reported an error or sent a malformed answer: the step left the table
  };
  struct Answer {
    Outcome outcome = Outcome::kDropped;
    std::unique_ptr<PendingStep> step;  // set for kComplete and kFailed
    absl::Status error;                 // kFailed: why
  };

  // REQUIRES: no step with the same id is pending; step->outstanding > 0.
  void Add(std::unique_ptr<PendingStep> step);

  // Records `node`'s answer (an encoded ExpertResponse, kept whole: its rows are read in place) to
  // the slot its step id names. An answer from a node the slot has since left (it went to a
  // replica) counts when well-formed (the same rows, computed by another host) and is dropped
  // otherwise. A kFailed error keeps the worker's status code; a malformed answer whose step id
  // was read fails its step with INTERNAL.
  Answer OnAnswer(PeerId node, MessageBytes message);

  // Removes and returns the steps still owed an answer by `node`, in id order.
  std::vector<std::unique_ptr<PendingStep>> TakeWaitingOn(PeerId node);
  // Removes and returns the steps whose deadline is at or before `now`, in id order.
  std::vector<std::unique_ptr<PendingStep>> TakeExpired(absl::Time now);
  // Removes and returns every step.
  std::vector<std::unique_ptr<PendingStep>> TakeAll();

  // The nodes that still owe `step` an answer, ascending.
  static std::vector<PeerId> Unanswered(const PendingStep& step);

  // Every node some pending step waits for, ascending.
  std::vector<PeerId> AwaitedNodes() const;
  // The earliest deadline; InfiniteFuture when nothing is pending.
  absl::Time NextDeadline() const;
  size_t size() const { return steps_.size(); }

 private:
  std::map<uint64_t, std::unique_ptr<PendingStep>> steps_;
};

}  // namespace k3

#endif  // K3SERVE_ROUTER_PENDING_STEPS_H_
