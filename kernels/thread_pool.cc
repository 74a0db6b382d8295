#include "kernels/thread_pool.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "glog/logging.h"
#include "kernels/step_profile.h"
#include "kernels/thread_pool_internal.h"

namespace k3 {
namespace internal {
namespace {

// How long an idle worker spins before it blocks. Decode leaves gaps of a few to a few tens of
// microseconds between kernel calls; waking a blocked thread costs about as much again. A process
// about to wait for another one cuts the spin short (RestKernelThreads).
constexpr std::chrono::microseconds kSpinTime(200);
// The caller yields its core after this many polls of a job that other threads still run, in case
// they were preempted (the machine may be oversubscribed).
constexpr int kCallerPollsBeforeYield = 1 << 14;
// Chunk indices and counts share one 64-bit word with the generation.
constexpr int kMaxThreads = 4096;

// Set while a thread runs (or waits for) a job, so that nested ParallelFor calls run inline.
thread_local bool t_in_job = false;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(threads) {
  CHECK_GE(threads, 1);
  CHECK_LE(threads, kMaxThreads);
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stop_.store(true);
    generation_.fetch_add(1);
    sleep_cv_.notify_all();
  }
  for (std::thread& worker : workers_) worker.join();
}

bool ThreadPool::Claim(uint32_t generation, int64_t* index) {
  uint64_t word = claim_.load(std::memory_order_acquire);
  while (true) {
    if (static_cast<uint32_t>(word >> 32) != generation) return false;
    uint64_t next = (word >> 16) & 0xffff;
    uint64_t count = word & 0xffff;
    if (next >= count) return false;
    if (claim_.compare_exchange_weak(word, word + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      *index = static_cast<int64_t>(next);
      return true;
    }
  }
}

void ThreadPool::RunChunks(uint32_t generation) {
  int64_t index;
  while (Claim(generation, &index)) {
    const int64_t begin = index * job_.chunk;
    const int64_t end = std::min(job_.n, begin + job_.chunk);
    (*job_.fn)(begin, end);
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::WorkerLoop() {
  t_in_job = true;  // a worker only ever runs inside jobs
  uint32_t seen = 0;
  while (true) {
    uint32_t generation = generation_.load(std::memory_order_acquire);
    if (generation == seen) {
      const auto spin_start = std::chrono::steady_clock::now();
      for (int polls = 1; generation == seen; ++polls) {
        CpuRelax();
        generation = generation_.load(std::memory_order_acquire);
        if (generation != seen || polls % 64 != 0) continue;
        if (resting_.load(std::memory_order_relaxed) ||
            std::chrono::steady_clock::now() - spin_start >= kSpinTime) {
          // Block. sleepers_ and generation_ are sequentially consistent on both sides, so either
          // the caller sees this sleeper and notifies under sleep_mu_, or this check sees the new
          // generation.
          std::unique_lock<std::mutex> lock(sleep_mu_);
          sleepers_.fetch_add(1);
          while ((generation = generation_.load()) == seen) sleep_cv_.wait(lock);
          sleepers_.fetch_sub(1);
        }
      }
    }
    if (stop_.load()) return;
    seen = generation;
    RunChunks(generation);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(n / grain, threads_);
  if (chunks <= 1 || t_in_job || resting_.load(std::memory_order_relaxed)) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;  // >= grain because chunks <= n / grain
  chunks = (n + chunk - 1) / chunk;

  std::lock_guard<std::mutex> submit(submit_mu_);
  const uint32_t generation = ++last_generation_;
  job_ = Job{&fn, n, chunk};
  unfinished_.store(chunks, std::memory_order_relaxed);
  claim_.store(uint64_t{generation} << 32 | static_cast<uint64_t>(chunks),
               std::memory_order_release);
  std::optional<ScopedStepPart> waking(std::in_place, StepPart::kForkJoin);
  generation_.store(generation);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    sleep_cv_.notify_all();
  }
  waking.reset();

  t_in_job = true;
  RunChunks(generation);
  const ScopedStepPart joining(StepPart::kForkJoin);
  for (int polls = 1; unfinished_.load(std::memory_order_acquire) != 0; ++polls) {
    if (polls < kCallerPollsBeforeYield) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  t_in_job = false;
}

void ThreadPool::Rest() { resting_.store(true, std::memory_order_relaxed); }

void ThreadPool::Wake() { resting_.store(false, std::memory_order_relaxed); }

}  // namespace internal

namespace {

int ThreadCountFromEnvironment() {
  const int hardware = std::max(1u, std::thread::hardware_concurrency());
  const char* value = std::getenv("K3SERVE_THREADS");
  if (value == nullptr || *value == '\0') return hardware;
  int threads = 0;
  const char* end = value + std::strlen(value);
  auto [ptr, error] = std::from_chars(value, end, threads);
  if (error != std::errc() || ptr != end || threads < 1 || threads > internal::kMaxThreads) {
    LOG(WARNING) << "K3SERVE_THREADS=\"" << value << "\" is not a thread count in [1, "
                 << internal::kMaxThreads << "]; using " << hardware;
    return hardware;
  }
  return threads;
}

internal::ThreadPool& GlobalPool() {
  // Never destroyed: kernels may run from other static destructors or detached threads at exit.
  static internal::ThreadPool* pool = new internal::ThreadPool(ThreadCountFromEnvironment());
  return *pool;
}

}  // namespace

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  GlobalPool().ParallelFor(n, grain, fn);
}

int KernelThreadCount() { return GlobalPool().size(); }

void RestKernelThreads() { GlobalPool().Rest(); }

void WakeKernelThreads() { GlobalPool().Wake(); }

}  // namespace k3
