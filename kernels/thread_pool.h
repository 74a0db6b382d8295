// The kernels' worker pool: ParallelFor splits an index range across a fixed set of threads
// (K3SERVE_THREADS, default: the hardware threads). The calling thread takes part, so a pool of one
// runs inline. Calls from several threads at once are serialized (the pool has one job at a time);
// a ParallelFor issued from inside a running job runs inline, so nesting cannot deadlock.
#ifndef K3SERVE_KERNELS_THREAD_POOL_H_
#define K3SERVE_KERNELS_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace k3 {

// Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long (but the
// last), and returns when all are done.
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

int KernelThreadCount();

// Idle workers block now instead of spinning for their usual couple of hundred microseconds, and
// ParallelFor runs on the calling thread alone until a caller wakes them (WakeKernelThreads).
// Call before waiting for another process (a transport receive): no kernel call comes until it
// answers, and a spinning worker would hold a core that process may need (a local cluster on a
// small machine). Cheap (one atomic store).
void RestKernelThreads();

// Ends a rest: the next ParallelFor splits its work over the workers again. For callers with
// enough work to pay for waking a blocked thread (tens of microseconds on a busy machine): with
// fewer cores than busy threads a woken worker may wait for a core, or lose it in the middle of
// a chunk its caller then waits for, which small jobs do not repay.
void WakeKernelThreads();

}  // namespace k3

#endif  // K3SERVE_KERNELS_THREAD_POOL_H_
