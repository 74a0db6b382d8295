// The receiving half shared by the Transport backends: turns what arrives from remote processes
// (each named by the 64-bit token its transport put in its address) into the Received stream of
// transport.h.
//
// It keeps per-sender order even when a large message finishes arriving after smaller ones sent
// later (Reserve a slot when the message is announced, Fill it when its data is in), holds messages
// from senders the owner has not bound to a PeerId yet, and puts a sender's failure after its
// messages. Thread-safe.
#ifndef K3SERVE_CLUSTER_INBOX_H_
#define K3SERVE_CLUSTER_INBOX_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/transport.h"

namespace k3 {

struct InboxEntry;

class Inbox {
 public:
  // A place in the stream for a message whose bytes are still arriving.
  using Slot = std::shared_ptr<InboxEntry>;

  Inbox() = default;
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Names `token`'s messages `peer` from now on, and releases those held for it. A token that
  // failed stays failed (a restarted process has a new token).
  void Bind(uint64_t token, PeerId peer);
  // Forgets the binding: later messages from `token` are held again. Delivered ones stay queued.
  void Unbind(uint64_t token);

  // A whole message from `token`.
  void Deliver(uint64_t token, MessageBytes bytes);
  // A message from `token` whose bytes will come later: Fill or Drop the slot exactly once. A slot
  // filled after its sender failed is still delivered, before the failure event.
  Slot Reserve(uint64_t token);
  void Fill(const Slot& slot, MessageBytes bytes);
  void Drop(const Slot& slot);

  // `token` died: unless it already failed, queues one kPeerFailed event (when bound) carrying
  // `error`, drops its held messages and everything it sends later.
  void Fail(uint64_t token, const absl::Status& error);
  bool Failed(uint64_t token) const;

  absl::StatusOr<Received> Receive(absl::Time deadline);
  // As above; while nothing is deliverable, the caller's thread runs drive(deadline) (without the
  // Inbox lock) to make messages arrive itself instead of sleeping until another thread delivers.
  // drive returns after it made some progress or at the deadline; false means it could not drive
  // now (another thread does), and then the caller waits for a delivery a while before retrying.
  absl::StatusOr<Received> Receive(absl::Time deadline,
                                   const std::function<bool(absl::Time)>& drive);

  // Wakes Receive calls: once the queue has nothing deliverable they return CANCELLED.
  void Close();

  // Messages and events of bound senders not yet received (those still arriving included).
  size_t Queued() const;

 private:
  using Entry = InboxEntry;

  bool HasDeliverableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes and returns the first deliverable entry, if any.
  std::optional<Received> PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(uint64_t token, std::shared_ptr<Entry> entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, PeerId> bound_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::deque<std::shared_ptr<Entry>>> held_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> failed_ ABSL_GUARDED_BY(mu_);
  // Bound entries in arrival order; an entry is delivered when it is ready and no earlier entry of
  // the same sender is still filling.
  std::deque<std::shared_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_INBOX_H_
