// A `k3serve serve` child process for the tests and benchmarks that talk to it as clients do:
// started with the given flags on 127.0.0.1 with ports picked for it, its addresses read from the
// lines it prints, stopped with SIGTERM (SIGKILL if still running when destroyed). Not
// thread-safe; the addresses may be read from any thread once Start returned.
#ifndef K3SERVE_TESTS_SERVE_PROCESS_H_
#define K3SERVE_TESTS_SERVE_PROCESS_H_

#include <stdio.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace k3 {

class ServeProcess {
 public:
  ServeProcess() = default;
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Runs `binary serve --model model --host 127.0.0.1 --port 0 --http-port 0 --metrics-port 0`
  // plus `extra_flags` (stderr: the caller's), and waits until it printed its three addresses.
  // UNAVAILABLE when it exits first.
  absl::Status Start(const std::string& binary, const std::string& model,
                     const std::vector<std::string>& extra_flags = {});
  // SIGTERM, then its exit status (-1 when it was killed by a signal or never started).
  int Stop();

  const std::string& generate_address() const { return generate_; }  // gRPC
  const std::string& http_address() const { return http_; }
  const std::string& metrics_address() const { return metrics_; }

 private:
  std::string ReadLine();

  FILE* pipe_ = nullptr;  // the child's stdout (through `sh -c 'echo $$; exec ...'`)
  pid_t pid_ = 0;
  std::string generate_, http_, metrics_;
};

}  // namespace k3

#endif  // K3SERVE_TESTS_SERVE_PROCESS_H_
