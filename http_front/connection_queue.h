// ConnectionQueue: how the HTTP front runs its connections (cpp-httplib's TaskQueue: the accept
// loop hands it one task per accepted connection, which serves that connection's requests until
// it closes).
//
// Each connection gets a thread of its own, so a stream that waits for tokens holds only its own
// connection's thread, never one of a fixed few: threads are started when every one is busy and
// end after `idle_timeout` without work. Up to `max_connections` connections are served at once;
// each connection accepted past that is still answered, by a thread of its own (at most
// kShedThreads of them at once; more wait their turn), but its tasks run with Shedding() true: the
// front answers its request with 503 and Retry-After and closes it, instead of leaving it in a
// queue or resetting it.
//
// Thread-safety: enqueue may be called from any thread (httplib calls it from the accept loop);
// shutdown once, after the accept loop stopped. shutdown serves the connections already accepted,
// then joins every thread.
#ifndef K3SERVE_HTTP_FRONT_CONNECTION_QUEUE_H_
#define K3SERVE_HTTP_FRONT_CONNECTION_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace k3 {

class ConnectionQueue final : public httplib::TaskQueue {
 public:
  // Connections past the limit that may be answered (503) at once.
  static constexpr int kShedThreads = 8;

  // `on_shed` (may be empty) is called on the accept thread for each connection accepted past
  // the limit: the front counts them.
  ConnectionQueue(int max_connections, absl::Duration idle_timeout,
                  std::function<void()> on_shed);
  ~ConnectionQueue() override;  // shutdown()

  void enqueue(std::function<void()> task) override;
  void shutdown() override;

  // True on a thread serving a connection accepted past max_connections.
  static bool Shedding();

 private:
  struct Task {
    std::function<void()> run;
    bool shed = false;
  };

  void Work();
  // Joins the threads that ended for lack of work.
  void ReapExited() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_connections_;
  const absl::Duration idle_timeout_;
  const std::function<void()> on_shed_;

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  int serving_ ABSL_GUARDED_BY(mu_) = 0;  // connections within the limit, queued or running
  int shedding_ ABSL_GUARDED_BY(mu_) = 0;  // connections past it, queued or running
  int idle_ ABSL_GUARDED_BY(mu_) = 0;      // threads waiting for a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> exited_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_CONNECTION_QUEUE_H_
