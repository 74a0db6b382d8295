// WaitFor: a test's wait on state that another thread changes, with a deadline, in place of a
// sleep of a guessed length (which is flaky on a loaded machine and slow on an idle one).
#ifndef K3SERVE_CLUSTER_TEST_WAIT_H_
#define K3SERVE_CLUSTER_TEST_WAIT_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace k3 {

// Evaluates `done` every millisecond until it holds or `timeout` has passed; returns its last
// value, so callers write ASSERT_TRUE(WaitFor(...)).
inline bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace k3

#endif  // K3SERVE_CLUSTER_TEST_WAIT_H_
