// Where one thread's time goes during engine steps, by part (matrix products, the kernel pool's
// fork-join waits, norms, Block AttnRes, the mixers' own work, routing, ...), for engine_bench's
// per-op breakdown of a decode step.
//
// Off by default: a ScopedStepPart then costs one relaxed atomic load. EnableStepProfile(true)
// profiles the calling thread only (the one that runs the steps; work that the kernel pool's
// workers do for it shows as the caller's time in the part that waits for it). Times are
// exclusive: a part nested inside another (a product inside a mixer) counts for itself, and the
// enclosing part keeps only the rest.
//
// Thread-safe: scopes may be opened on any thread (only the profiled thread's count);
// EnableStepProfile and TakeStepProfile may be called from any thread.
#ifndef K3SERVE_KERNELS_STEP_PROFILE_H_
#define K3SERVE_KERNELS_STEP_PROFILE_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace k3 {

enum class StepPart : int {
  kProducts,   // k3::MatMul and MatMulBatch (weights x activations)
  kForkJoin,   // the caller's wait for the pool's workers to finish their chunks, and waking them
  kNorms,      // RMSNorm
  kAttnRes,    // Block AttnRes depth reads, outside their products and norms
  kMixers,     // KDA and MLA outside their products (convolution, delta rule, attention)
  kMoe,        // router, top-k, gathering and combining the routed experts, outside products
  kGatedMlp,   // the gated MLPs' activation, outside their products
  kCount,
};

// A short lower-case name ("products", "fork-join", ...).
const char* StepPartName(StepPart part);

// Seconds and scope entries per part since the last TakeStepProfile.
struct StepPartTotals {
  std::array<double, static_cast<int>(StepPart::kCount)> seconds{};
  std::array<int64_t, static_cast<int>(StepPart::kCount)> calls{};
};

// Starts (or stops) profiling the calling thread.
void EnableStepProfile(bool enabled);
// The totals so far, and resets them.
StepPartTotals TakeStepProfile();

namespace internal {
extern std::atomic<bool> g_step_profile_enabled;
}  // namespace internal

// Counts the time until its destruction for `part` (less the time of scopes nested inside it).
class ScopedStepPart {
 public:
  explicit ScopedStepPart(StepPart part) {
    if (internal::g_step_profile_enabled.load(std::memory_order_relaxed)) Start(part);
  }
  ~ScopedStepPart() {
    if (active_) Stop();
  }
  ScopedStepPart(const ScopedStepPart&) = delete;
  ScopedStepPart& operator=(const ScopedStepPart&) = delete;

 private:
  void Start(StepPart part);
  void Stop();

  bool active_ = false;
  StepPart part_ = StepPart::kProducts;
  int64_t start_ns_ = 0;
  int64_t nested_ns_ = 0;
  ScopedStepPart* parent_ = nullptr;
};

}  // namespace k3

#endif  // K3SERVE_KERNELS_STEP_PROFILE_H_
