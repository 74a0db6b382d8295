// Actor: one thread that runs the closures posted to its mailbox, one at a time.
//
// State that only posted closures touch needs no lock: the actor thread is its only user. Closures
// run in the order they became due; closures due at the same moment run in posting order, so two
// Posts from one thread run in that order.
//
// Thread-safety: Post, PostAfter and Call may be called from any thread, including the actor's own
// (Call then runs the closure inline instead of deadlocking on itself). Stop and the destructor
// must not be called from the actor thread.
//
// Closures must not block for long: everything behind them in the mailbox waits.
#ifndef K3SERVE_CLUSTER_ACTOR_H_
#define K3SERVE_CLUSTER_ACTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace k3 {

namespace actor_internal {

// Call's result type: a closure returning T gives StatusOr<T>; one returning Status or StatusOr<U>
// gives that type back (the actor's own errors merge into it); void gives Status.
template <typename T>
struct CallResult {
  using Type = absl::StatusOr<T>;
};
template <>
struct CallResult<void> {
  using Type = absl::Status;
};
template <>
struct CallResult<absl::Status> {
  using Type = absl::Status;
};
template <typename U>
struct CallResult<absl::StatusOr<U>> {
  using Type = absl::StatusOr<U>;
};

}  // namespace actor_internal

class Actor {
 public:
  // Starts the thread. `name` names the thread (first 15 characters) and appears in errors.
  explicit Actor(std::string name);
  // Stop().
  ~Actor();

  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // Queues fn to run as soon as the closures ahead of it have run. Returns false, dropping fn,
  // once Stop has begun.
  bool Post(std::function<void()> fn);

  // Queues fn to run no earlier than `delay` from now (a timer). Timers not yet due when Stop
  // begins are dropped without running.
  bool PostAfter(absl::Duration delay, std::function<void()> fn);

  // Runs fn on the actor thread and waits until it returns or `deadline` passes.
  // Errors: DEADLINE_EXCEEDED if fn has not finished by the deadline (it still runs later, so it
  // must own what it captures); UNAVAILABLE if the actor is stopping. See CallResult for the type.
  template <typename F>
  auto Call(F fn, absl::Time deadline) ->
      typename actor_internal::CallResult<std::invoke_result_t<F&>>::Type;

  // Rejects further posts, runs the closures already due, drops pending timers and joins the
  // thread. Idempotent.
  void Stop();

  // True when called from this actor's thread.
  bool IsCurrent() const { return std::this_thread::get_id() == thread_id_; }

  const std::string& name() const { return name_; }

 private:
  struct Timer {
    absl::Time due;
    uint64_t seq;  // FIFO among timers due at the same time
    std::function<void()> fn;
    bool operator>(const Timer& other) const {
      return due != other.due ? due > other.due : seq > other.seq;
    }
  };

  void Loop();

  const std::string name_;
  absl::Mutex mu_;
  absl::CondVar wake_;
  std::deque<std::function<void()>> ready_ ABSL_GUARDED_BY(mu_);
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread::id thread_id_;
  absl::Mutex stop_mu_;  // serializes Stop callers around the join
};

// --- Implementation of Call ----------------------------------------------------------------------

template <typename F>
auto Actor::Call(F fn, absl::Time deadline) ->
    typename actor_internal::CallResult<std::invoke_result_t<F&>>::Type {
  using T = std::invoke_result_t<F&>;
  using Result = typename actor_internal::CallResult<T>::Type;
  if (IsCurrent()) {
    if constexpr (std::is_void_v<T>) {
      fn();
      return absl::OkStatus();
    } else {
      return Result(fn());
    }
  }
  // Shared with the closure, which may outlive this call when the deadline passes first.
  struct State {
    absl::Mutex mu;
    std::optional<Result> result ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  const bool posted = Post([state, fn = std::move(fn)]() mutable {
    Result result = [&]() -> Result {
      if constexpr (std::is_void_v<T>) {
        fn();
        return absl::OkStatus();
      } else {
        return Result(fn());
      }
    }();
    absl::MutexLock lock(&state->mu);
    state->result.emplace(std::move(result));
  });
  if (!posted) return absl::UnavailableError("actor " + name_ + " is stopped");
  absl::MutexLock lock(&state->mu);
  auto done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->result.has_value();
  };
  if (!state->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError("actor " + name_ + " did not answer before the deadline");
  }
  return std::move(*state->result);
}

}  // namespace k3

#endif  // K3SERVE_CLUSTER_ACTOR_H_
