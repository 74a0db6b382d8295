// The pool behind k3::ParallelFor (kernels/thread_pool.h), exposed so that tests can build pools of
// several sizes. The engine uses only the process-wide pool.
//
// Design: persistent workers wait for a generation counter to change, spinning for a short while
// before they block on a condition variable, so back-to-back calls (decode issues thousands per
// token) cost about a microsecond and an idle pool costs nothing. Chunks are claimed from one atomic
// word that also carries the generation, so a worker that wakes late cannot take part in a job that
// is already over.
#ifndef K3SERVE_KERNELS_THREAD_POOL_INTERNAL_H_
#define K3SERVE_KERNELS_THREAD_POOL_INTERNAL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3::internal {

// Thread-safe: any thread may call ParallelFor; concurrent calls are serialized, and calls made from
// inside a running job (of any pool) run inline on the calling thread.
class ThreadPool {
 public:
  // `threads` counts the calling thread: threads - 1 workers are started. REQUIRES: threads >= 1.
  explicit ThreadPool(int threads);
  // REQUIRES: no ParallelFor is running.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The contract of k3::ParallelFor. At most size() chunks.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Idle workers stop spinning and block; jobs run inline until Wake (RestKernelThreads).
  void Rest();
  void Wake();

  int size() const { return threads_; }
  // Workers blocked on the condition variable (or about to, holding its mutex), which only a
  // notify wakes; for tests that need them there.
  int BlockedWorkers() const { return sleepers_.load(); }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int64_t chunk = 0;
  };

  void WorkerLoop();
  // Runs chunks of job `generation` until none is left to claim.
  void RunChunks(uint32_t generation);
  // Claims the next chunk of job `generation`; false once the job has none left or is over.
  bool Claim(uint32_t generation, int64_t* index);

  const int threads_;
  std::vector<std::thread> workers_;

  std::mutex submit_mu_;  // held by the caller for the whole job: one job at a time
  uint32_t last_generation_ = 0;  // guarded by submit_mu_

  // Written by the caller before it publishes a generation; read only by threads that claimed a
  // chunk of that generation, and rewritten only after all its chunks finished.
  Job job_;
  // (generation << 32) | (next chunk << 16) | chunk count.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> unfinished_{0};  // chunks of the current job not yet finished
  std::atomic<uint32_t> generation_{0};  // what workers wait on
  std::atomic<bool> stop_{false};
  // Set by Rest(), cleared by Wake(): an idle worker that sees it blocks instead of spinning, and
  // ParallelFor runs inline.
  std::atomic<bool> resting_{false};

  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace k3::internal

#endif  // K3SERVE_KERNELS_THREAD_POOL_INTERNAL_H_
