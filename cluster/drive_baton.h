// DriveBaton: which thread drives a UcxTransport's UCX worker and sockets, at most one at a time
// ("holds the baton", ucx_transport.h, "Progress").
//
// Threads blocked in Receive come first, so that the message a receiver waits for wakes that
// receiver directly: the progress thread takes the baton only while no receiver waits for it, and
// not until kLinger after a receiver last let go, so a loop of Receive calls keeps the baton
// without a hand-off each time. A receiver that finds the baton held wakes the holder (which
// returns from poll and lets go) and waits a little for it.
//
// Owns only its bookkeeping; the holder drives without any lock of the baton's. Thread-safety:
// every method from any thread. `wake_holder` runs under the baton's lock, so it must not take a
// lock that is ever held while a method here is called.
#ifndef K3SERVE_CLUSTER_DRIVE_BATON_H_
#define K3SERVE_CLUSTER_DRIVE_BATON_H_

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace k3 {

class DriveBaton {
 public:
  // After a receiver drove, the progress thread leaves the baton alone this long.
  static constexpr absl::Duration kLinger = absl::Milliseconds(2);
  // How long a receiver waits for the holder to let go before it gives up this try.
  static constexpr absl::Duration kReceiverPatience = absl::Milliseconds(5);

  // For the progress thread: blocks until the baton is free, no receiver waits for it and kLinger
  // has passed since a receiver let go; then holds it. False, not holding it, once stopped.
  bool TakeForProgress();
  void ReleaseFromProgress();

  // For a receiver: takes the baton if it is free; else calls `wake_holder` and waits for the
  // holder to let go until `deadline` or kReceiverPatience, whichever comes first. False, not
  // holding it, when stopped or the holder kept it.
  bool TakeForReceiver(absl::Time deadline, absl::FunctionRef<void()> wake_holder);
  void ReleaseFromReceiver();

  // From now on only TakeForGood takes the baton; a waiting TakeForProgress returns false.
  void Stop();
  // Waits for the holder to let go, then keeps the baton for good (so that no one drives again).
  void TakeForGood();

 private:
  absl::Mutex mu_;
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  int receivers_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_receiver_drive_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_DRIVE_BATON_H_
