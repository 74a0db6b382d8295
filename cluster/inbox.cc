#include "cluster/inbox.h"

#include <algorithm>
#include <utility>

namespace k3 {

struct InboxEntry {
  uint64_t token = 0;
  bool ready = false;
  bool dropped = false;
  Received received;
};

void Inbox::Bind(uint64_t token, PeerId peer) {
  absl::MutexLock lock(&mu_);
  bound_[token] = peer;
  auto held = held_.find(token);
  if (held == held_.end()) return;
  for (std::shared_ptr<Entry>& entry : held->second) {
    entry->received.from = peer;
    queue_.push_back(std::move(entry));
  }
  held_.erase(held);
}

void Inbox::Unbind(uint64_t token) {
  absl::MutexLock lock(&mu_);
  bound_.erase(token);
}

void Inbox::EnqueueLocked(uint64_t token, std::shared_ptr<Entry> entry) {
  entry->token = token;
  auto bound = bound_.find(token);
  if (bound == bound_.end()) {
    held_[token].push_back(std::move(entry));
    return;
  }
  entry->received.from = bound->second;
  queue_.push_back(std::move(entry));
}

void Inbox::Deliver(uint64_t token, MessageBytes bytes) {
  auto entry = std::make_shared<Entry>();
  entry->ready = true;
  entry->received.bytes = std::move(bytes);
  absl::MutexLock lock(&mu_);
  if (failed_.count(token)) return;
  EnqueueLocked(token, std::move(entry));
}

Inbox::Slot Inbox::Reserve(uint64_t token) {
  auto entry = std::make_shared<Entry>();
  absl::MutexLock lock(&mu_);
  if (failed_.count(token)) {
    entry->dropped = true;
    return entry;
  }
  EnqueueLocked(token, entry);
  return entry;
}

void Inbox::Fill(const Slot& slot, MessageBytes bytes) {
  absl::MutexLock lock(&mu_);
  if (slot->dropped) return;
  slot->received.bytes = std::move(bytes);
  slot->ready = true;
}

void Inbox::Drop(const Slot& slot) {
  absl::MutexLock lock(&mu_);
  if (slot->dropped) return;
  slot->dropped = true;
  auto drop_from = [&](std::deque<std::shared_ptr<Entry>>& entries) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (*it == slot) {
        entries.erase(it);
        return true;
      }
    }
    return false;
  };
  if (drop_from(queue_)) return;
  auto held = held_.find(slot->token);
  if (held != held_.end()) drop_from(held->second);
}

void Inbox::Fail(uint64_t token, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  if (!failed_.insert(token).second) return;
  auto held = held_.find(token);
  if (held != held_.end()) {
    for (const std::shared_ptr<Entry>& entry : held->second) entry->dropped = true;
    held_.erase(held);
  }
  auto bound = bound_.find(token);
  if (bound == bound_.end()) return;
  auto entry = std::make_shared<Entry>();
  entry->token = token;
  entry->ready = true;
  entry->received.kind = Received::Kind::kPeerFailed;
  entry->received.from = bound->second;
  entry->received.error = error;
  queue_.push_back(std::move(entry));
}

size_t Inbox::Queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool Inbox::Failed(uint64_t token) const {
  absl::MutexLock lock(&mu_);
  return failed_.count(token) > 0;
}

bool Inbox::HasDeliverableLocked() const {
  std::set<uint64_t> filling;
  for (const std::shared_ptr<Entry>& entry : queue_) {
    if (entry->ready && !filling.count(entry->token)) return true;
    if (!entry->ready) filling.insert(entry->token);
  }
  return false;
}

std::optional<Received> Inbox::PopLocked() {
  std::set<uint64_t> filling;
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    std::shared_ptr<Entry>& entry = *it;
    if (entry->ready && !filling.count(entry->token)) {
      Received received = std::move(entry->received);
      queue_.erase(it);
      return received;
    }
    if (!entry->ready) filling.insert(entry->token);
  }
  return std::nullopt;
}

absl::StatusOr<Received> Inbox::Receive(absl::Time deadline) { return Receive(deadline, nullptr); }

absl::StatusOr<Received> Inbox::Receive(absl::Time deadline,
                                        const std::function<bool(absl::Time)>& drive) {
  // A caller that cannot drive re-checks this often whether it can.
  constexpr absl::Duration kDriveRetry = absl::Milliseconds(10);
  auto wake = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || HasDeliverableLocked(); };
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (std::optional<Received> received = PopLocked()) return std::move(*received);
    if (closed_) return absl::CancelledError("transport closed");
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("no message before the deadline");
    if (drive != nullptr) {
      mu_.Unlock();
      const bool drove = drive(deadline);
      mu_.Lock();
      if (drove) continue;
    }
    mu_.AwaitWithDeadline(absl::Condition(&wake),
                          drive != nullptr ? std::min(deadline, now + kDriveRetry) : deadline);
  }
}

void Inbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace k3
