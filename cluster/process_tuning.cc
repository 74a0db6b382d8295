#include "cluster/process_tuning.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace k3 {

void TuneServingProcess() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace k3
