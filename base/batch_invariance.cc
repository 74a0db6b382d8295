#include "base/batch_invariance.h"

#include <atomic>

namespace k3 {
namespace {

std::atomic<bool> g_batch_invariant{true};

}  // namespace

bool BatchInvariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

void SetBatchInvariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }

}  // namespace k3
