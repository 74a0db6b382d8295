#include "base/batch_invariance.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace k3 {
namespace {

// K3SERVE_BATCH_INVARIANT=0 turns it off for the whole process (every role, tool and bench; the
// local launcher's children inherit it); anything else, or unset, leaves it on.
bool FromEnvironment() {
  const char* value = std::getenv("K3SERVE_BATCH_INVARIANT");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

std::atomic<bool>& Flag() {
  static std::atomic<bool> flag{FromEnvironment()};
  return flag;
}

}  // namespace

bool BatchInvariant() { return Flag().load(std::memory_order_relaxed); }

void SetBatchInvariant(bool on) { Flag().store(on, std::memory_order_relaxed); }

}  // namespace k3
