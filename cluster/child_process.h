// Tests (and benches) that need real peer processes start copies of their own binary (selected by
// an environment variable or a flag that the binary's main() checks) and talk to them over pipes:
// the child's stdin and stdout. A ChildProcess kills its child (SIGKILL) when destroyed, so no
// test leaves processes behind. Not thread-safe.
#ifndef K3SERVE_CLUSTER_CHILD_PROCESS_H_
#define K3SERVE_CLUSTER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace k3 {

class ChildProcess {
 public:
  // Runs this binary with `args` and with this process's environment plus `env`, behind `wrapper`
  // when given (e.g. {"ip", "netns", "exec", "ns1"}: the wrapper then runs the binary). Null if it
  // could not start.
  static std::unique_ptr<ChildProcess> Spawn(const std::map<std::string, std::string>& env,
                                             const std::vector<std::string>& wrapper = {},
                                             const std::vector<std::string>& args = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line the child printed, or "timeout" / "eof".
  std::string ReadLine(absl::Duration timeout = absl::Seconds(15));
  void WriteLine(const std::string& line);
  // The exit status (128 + signal when killed), or -1 if it did not exit in time.
  int Wait(absl::Duration timeout = absl::Seconds(10));
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  ChildProcess() = default;

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
};

// For the child: dies with its parent (the test or bench), so a crashed one leaves no orphans.
void DieWithParent();

}  // namespace k3

#endif  // K3SERVE_CLUSTER_CHILD_PROCESS_H_
