#include "kernels/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/thread_pool_internal.h"

namespace k3::internal {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// Runs one ParallelFor and returns its chunks in order.
Chunks Record(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex mu;
  Chunks chunks;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

// The chunks tile [0, n) exactly, each is at least `grain` long but the last, and there are at
// most `threads` of them.
void ExpectValidSplit(const Chunks& chunks, int64_t n, int64_t grain, int threads) {
  if (n <= 0) {
    EXPECT_TRUE(chunks.empty());
    return;
  }
  ASSERT_FALSE(chunks.empty());
  EXPECT_LE(static_cast<int64_t>(chunks.size()), threads);
  int64_t expected_begin = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].first, expected_begin) << "n=" << n << " grain=" << grain;
    EXPECT_LT(chunks[i].first, chunks[i].second);
    if (i + 1 < chunks.size()) EXPECT_GE(chunks[i].second - chunks[i].first, grain);
    expected_begin = chunks[i].second;
  }
  EXPECT_EQ(expected_begin, n);
}

TEST(ThreadPoolTest, ChunksCoverTheRange) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1001}) {
      for (int64_t grain : {0, 1, 2, 3, 10, 64, 5000}) {
        ExpectValidSplit(Record(pool, n, grain), n, grain, threads);
      }
    }
  }
}

TEST(ThreadPoolTest, UsesSeveralThreadsWhenWorkAllows) {
  ThreadPool pool(2);
  EXPECT_EQ(Record(pool, 100, 1).size(), 2u);
  EXPECT_EQ(Record(pool, 100, 60).size(), 1u);  // two chunks of >= 60 do not fit
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceOverManyCalls) {
  ThreadPool pool(3);
  constexpr int64_t kN = 1000;
  std::vector<std::atomic<int>> hits(kN);
  constexpr int kCalls = 2000;  // many short jobs exercise the wake-up and claim races
  for (int call = 0; call < kCalls; ++call) {
    pool.ParallelFor(kN, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(hits[i].load(), kCalls) << "index " << i;
}

// Runs a job of pool.size() chunks in which each chunk waits (bounded) for all the others, so
// every thread must take one; returns how many threads ran chunks.
size_t ThreadsOfAJobNeedingAll(ThreadPool& pool) {
  const int n = pool.size();
  std::set<std::thread::id> ids;
  std::mutex mu;
  std::atomic<int> arrived{0};
  pool.ParallelFor(n, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (arrived.load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  return ids.size();
}

// Waits until `workers` workers of `pool` are blocked (they stopped spinning); false after 5 s.
bool WaitUntilBlocked(const ThreadPool& pool, int workers) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (pool.BlockedWorkers() < workers) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ThreadPoolTest, WorkersWakeAfterBlocking) {
  ThreadPool pool(2);
  for (int call = 0; call < 3; ++call) {
    ASSERT_TRUE(WaitUntilBlocked(pool, 1)) << "call " << call;
    EXPECT_EQ(ThreadsOfAJobNeedingAll(pool), 2u) << "call " << call;
  }
}

// Rest() makes idle workers block at once and jobs run on the caller until Wake(); jobs cover
// every index also when Rest() and Wake() race with them (they are called from other threads).
TEST(ThreadPoolTest, RestingWorkersLeaveJobsToTheCallerUntilWoken) {
  ThreadPool pool(3);
  std::atomic<bool> stop{false};
  std::thread rester([&] {
    for (int i = 0; !stop.load(); ++i) {
      if (i % 2 == 0) {
        pool.Rest();
      } else {
        pool.Wake();
      }
      std::this_thread::yield();
    }
  });
  for (int call = 0; call < 2000; ++call) {
    if (call % 100 == 0) pool.Rest();
    if (call % 100 == 50) pool.Wake();
    const int64_t n = 1 + call % 37;
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "call " << call << " i " << i;
  }
  stop.store(true);
  rester.join();
  // After a rest every job runs on the caller alone, in one chunk.
  pool.Rest();
  EXPECT_EQ(Record(pool, 100, 1), (Chunks{{0, 100}}));
  std::set<std::thread::id> ids;
  pool.ParallelFor(3, 1, [&](int64_t, int64_t) { ids.insert(std::this_thread::get_id()); });
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  // Woken (after they blocked), a job that needs all three threads gets them.
  ASSERT_TRUE(WaitUntilBlocked(pool, 2));
  pool.Wake();
  EXPECT_EQ(ThreadsOfAJobNeedingAll(pool), 3u);
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(3);
  constexpr int64_t kOuter = 6, kInner = 50;
  std::vector<std::atomic<int>> hits(kOuter * kInner);
  std::atomic<int> nested_on_other_thread{0};
  pool.ParallelFor(kOuter, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const std::thread::id outer_thread = std::this_thread::get_id();
      pool.ParallelFor(kInner, 1, [&](int64_t b, int64_t e) {
        if (std::this_thread::get_id() != outer_thread) nested_on_other_thread.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[o * kInner + i].fetch_add(1);
      });
    }
  });
  EXPECT_EQ(nested_on_other_thread.load(), 0);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  ThreadPool pool(2);
  constexpr int kCallers = 4, kCallsEach = 300;
  constexpr int64_t kN = 64;
  std::mutex mu;
  int active_chunks = 0;     // guarded by mu
  int active_caller = -1;    // guarded by mu
  int foreign_overlaps = 0;  // guarded by mu
  std::atomic<int> unfinished_at_return{0};
  std::vector<std::vector<int>> sums(kCallers, std::vector<int>(kN, 0));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCallsEach; ++call) {
        std::atomic<int> chunks_done{0};
        pool.ParallelFor(kN, 1, [&](int64_t begin, int64_t end) {
          {
            std::lock_guard<std::mutex> lock(mu);
            if (active_chunks > 0 && active_caller != c) ++foreign_overlaps;
            active_caller = c;
            ++active_chunks;
          }
          for (int64_t i = begin; i < end; ++i) sums[c][i] += 1;
          std::this_thread::yield();  // widen the window in which another job could intrude
          {
            std::lock_guard<std::mutex> lock(mu);
            --active_chunks;
          }
          chunks_done.fetch_add(1);
        });
        if (chunks_done.load() != 2) unfinished_at_return.fetch_add(1);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(foreign_overlaps, 0);
  EXPECT_EQ(unfinished_at_return.load(), 0);
  for (int c = 0; c < kCallers; ++c) {
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(sums[c][i], kCallsEach);
  }
}

TEST(ThreadPoolTest, SinglethreadPoolRunsInline) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(1000, 1, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 1000);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

// The process-wide pool reads K3SERVE_THREADS once, so each case runs in a fresh process (the
// "threadsafe" death-test style re-executes the test binary).
TEST(ThreadPoolDeathTest, GlobalPoolSizeComesFromTheEnvironment) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("K3SERVE_THREADS", "3", 1);
        std::exit(KernelThreadCount() == 3 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const char* bad : {"0", "-2", "two", "3x", "100000"}) {
    EXPECT_EXIT(
        {
          setenv("K3SERVE_THREADS", bad, 1);
          std::exit(KernelThreadCount() == hardware ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "K3SERVE_THREADS")
        << bad;
  }
}

TEST(ThreadPoolTest, GlobalPoolCoversTheRange) {
  EXPECT_GE(KernelThreadCount(), 1);
  std::vector<std::atomic<int>> hits(777);
  k3::ParallelFor(777, 5, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace k3::internal
