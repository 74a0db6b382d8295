// GreedyLoad: a steady load on a cluster's Generate API for the fault tests. `clients` threads
// each send greedy requests one after the other (prompt (client + n * clients) mod the prompts'
// count, in turn) until Stop, and check every outcome against the expected tokens of that prompt
// (a failed call or different tokens is a failure, kept with the request id).
//
// Thread-safety: every method may be called from any thread.
#ifndef K3SERVE_TESTS_GREEDY_LOAD_H_
#define K3SERVE_TESTS_GREEDY_LOAD_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace k3 {

class GreedyLoad {
 public:
  // Starts the clients at once. REQUIRES: prompts.size() == expected.size() > 0.
  GreedyLoad(std::string address, std::vector<std::vector<int32_t>> prompts,
             std::vector<std::vector<int32_t>> expected, int clients, int max_new_tokens,
             absl::Duration request_timeout);
  ~GreedyLoad();  // Stop()
  GreedyLoad(const GreedyLoad&) = delete;
  GreedyLoad& operator=(const GreedyLoad&) = delete;

  // Lets every client finish its request and joins them. Idempotent.
  void Stop();

  int completed() const { return completed_.load(); }
  // Waits until `more` requests completed after the call (false on a failure or the timeout).
  bool WaitMore(int more, absl::Duration timeout);
  // Waits until a request failed.
  bool WaitFailed(absl::Duration timeout);
  int failed() const;
  std::vector<std::string> failures() const;
  absl::Time first_failure() const;  // InfiniteFuture before the first
  // The longest time between two token chunks of one stream (or from its start to its first,
  // or from its last to its end) since the start or the last ResetLongestGap.
  absl::Duration longest_gap() const;
  void ResetLongestGap();

 private:
  void Run(int client);

  const std::string address_;
  const std::vector<std::vector<int32_t>> prompts_;
  const std::vector<std::vector<int32_t>> expected_;
  const int clients_;
  const int max_new_tokens_;
  const absl::Duration request_timeout_;
  std::atomic<bool> stop_{false};
  std::atomic<int> completed_{0};
  mutable absl::Mutex mu_;
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
  absl::Time first_failure_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration longest_gap_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::vector<std::thread> threads_;
};

}  // namespace k3

#endif  // K3SERVE_TESTS_GREEDY_LOAD_H_
