// WaitFor: a test's wait on state that another thread changes, with a deadline, in place of a
// sleep of a guessed length (which is flaky on a loaded machine and slow on an idle one).
// ThreadIsAsleep: the state to wait for when a test needs another thread blocked inside a call.
#ifndef K3SERVE_CLUSTER_TEST_WAIT_H_
#define K3SERVE_CLUSTER_TEST_WAIT_H_

#include <sys/types.h>

#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
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

// Whether thread `tid` of this process (gettid()) is asleep in the kernel (state S: blocked in
// poll, on a futex, ...), as opposed to running.
inline bool ThreadIsAsleep(pid_t tid) {
  std::ifstream stat(absl::StrCat("/proc/self/task/", tid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // "tid (comm) S ...": the state follows the command name's closing parenthesis.
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'S';
}

}  // namespace k3

#endif  // K3SERVE_CLUSTER_TEST_WAIT_H_
