#include "kernels/step_profile.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace k3 {
namespace {

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Nested parts count exclusively: the outer part keeps only its own time.
TEST(StepProfileTest, NestedPartsAreExclusive) {
  TakeStepProfile();
  EnableStepProfile(true);
  {
    const ScopedStepPart outer(StepPart::kMixers);
    SleepMs(20);
    const ScopedStepPart inner(StepPart::kProducts);
    SleepMs(40);
  }
  EnableStepProfile(false);
  const StepPartTotals totals = TakeStepProfile();
  const double mixers = totals.seconds[static_cast<int>(StepPart::kMixers)];
  const double products = totals.seconds[static_cast<int>(StepPart::kProducts)];
  EXPECT_GE(mixers, 0.019);
  EXPECT_LT(mixers, 0.039);  // not the 60 ms the whole scope took
  EXPECT_GE(products, 0.039);
  EXPECT_EQ(totals.calls[static_cast<int>(StepPart::kMixers)], 1);
  EXPECT_EQ(totals.calls[static_cast<int>(StepPart::kProducts)], 1);
}

// Only the thread that enabled the profile counts, and nothing while it is off.
TEST(StepProfileTest, OnlyTheProfiledThreadWhileEnabled) {
  TakeStepProfile();
  {
    const ScopedStepPart off(StepPart::kNorms);
    SleepMs(5);
  }
  EnableStepProfile(true);
  std::thread other([] {
    const ScopedStepPart elsewhere(StepPart::kNorms);
    SleepMs(5);
  });
  other.join();
  EnableStepProfile(false);
  const StepPartTotals totals = TakeStepProfile();
  EXPECT_EQ(totals.calls[static_cast<int>(StepPart::kNorms)], 0);
  EXPECT_EQ(totals.seconds[static_cast<int>(StepPart::kNorms)], 0.0);
}

}  // namespace
}  // namespace k3
