#include "kernels/step_profile.h"

#include <chrono>
#include <thread>

namespace k3 {
namespace internal {
std::atomic<bool> g_step_profile_enabled{false};
}  // namespace internal

namespace {

constexpr int kParts = static_cast<int>(StepPart::kCount);

std::atomic<std::thread::id> g_profiled_thread{};
std::atomic<int64_t> g_nanos[kParts];
std::atomic<int64_t> g_calls[kParts];
// The innermost open scope of this thread.
thread_local ScopedStepPart* t_current = nullptr;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* StepPartName(StepPart part) {
  switch (part) {
    case StepPart::kProducts: return "products";
    case StepPart::kForkJoin: return "fork-join";
    case StepPart::kNorms: return "norms";
    case StepPart::kAttnRes: return "attn-res";
    case StepPart::kMixers: return "mixers";
    case StepPart::kMoe: return "moe-routing";
    case StepPart::kGatedMlp: return "gated-mlp";
    default: return "?";
  }
}

void EnableStepProfile(bool enabled) {
  g_profiled_thread.store(std::this_thread::get_id());
  internal::g_step_profile_enabled.store(enabled, std::memory_order_relaxed);
}

StepPartTotals TakeStepProfile() {
  StepPartTotals totals;
  for (int i = 0; i < kParts; ++i) {
    totals.seconds[i] = 1e-9 * static_cast<double>(g_nanos[i].exchange(0));
    totals.calls[i] = g_calls[i].exchange(0);
  }
  return totals;
}

void ScopedStepPart::Start(StepPart part) {
  if (std::this_thread::get_id() != g_profiled_thread.load(std::memory_order_relaxed)) return;
  active_ = true;
  part_ = part;
  parent_ = t_current;
  t_current = this;
  start_ns_ = NowNanos();
}

void ScopedStepPart::Stop() {
  const int64_t elapsed = NowNanos() - start_ns_;
  const int i = static_cast<int>(part_);
  g_nanos[i].fetch_add(elapsed - nested_ns_, std::memory_order_relaxed);
  g_calls[i].fetch_add(1, std::memory_order_relaxed);
  if (parent_ != nullptr) parent_->nested_ns_ += elapsed;
  t_current = parent_;
}

}  // namespace k3
