#include "cluster/drive_baton.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace k3 {

bool DriveBaton::TakeForProgress() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!driving_ && receivers_waiting_ == 0);
    };
    mu_.Await(absl::Condition(&free));
    if (stopping_) return false;
    const absl::Duration rest = last_receiver_drive_ + kLinger - absl::Now();
    if (rest <= absl::ZeroDuration()) break;
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), rest);
  }
  driving_ = true;
  return true;
}

void DriveBaton::ReleaseFromProgress() {
  absl::MutexLock lock(&mu_);
  driving_ = false;
}

bool DriveBaton::TakeForReceiver(absl::Time deadline, absl::FunctionRef<void()> wake_holder) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  if (driving_) {
    ++receivers_waiting_;
    wake_holder();  // the holder returns from poll; the progress thread then yields
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !driving_ || stopping_; };
    mu_.AwaitWithDeadline(absl::Condition(&free),
                          std::min(deadline, absl::Now() + kReceiverPatience));
    --receivers_waiting_;
    if (driving_ || stopping_) return false;
  }
  driving_ = true;
  return true;
}

void DriveBaton::ReleaseFromReceiver() {
  absl::MutexLock lock(&mu_);
  driving_ = false;
  last_receiver_drive_ = absl::Now();
}

void DriveBaton::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void DriveBaton::TakeForGood() {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !driving_; };
  mu_.Await(absl::Condition(&free));
  driving_ = true;
}

}  // namespace k3
