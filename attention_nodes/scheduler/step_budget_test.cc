#include "attention_nodes/scheduler/step_budget.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// A fake machine: a step of n tokens costs 10 ms + 0.1 ms per token.
absl::Duration StepTime(int64_t tokens) {
  return absl::Milliseconds(10) + absl::Microseconds(100) * tokens;
}

StepBudgetOptions Options() {
  StepBudgetOptions options;
  options.max_tokens = 2048;
  options.min_prompt_tokens = 16;
  options.target_factor = 2.0;
  options.ttft_target = absl::Seconds(2);
  return options;
}

TEST(StepBudgetTest, FloorBeforeAFitAndEverythingWithoutDecoders) {
  StepBudget budget(Options());
  EXPECT_EQ(budget.PromptTokens(4, absl::ZeroDuration()), 16);
  EXPECT_EQ(budget.PromptTokens(0, absl::ZeroDuration()), 2048);
  EXPECT_EQ(budget.PromptTokens(2040, absl::ZeroDuration()), 8);
  budget.ObserveStep(1, StepTime(1));  // one size only: no slope yet
  EXPECT_EQ(budget.per_token_cost(), absl::ZeroDuration());
  EXPECT_EQ(budget.PromptTokens(4, absl::ZeroDuration()), 16);
}

TEST(StepBudgetTest, LearnsTheCostLineAndFillsTheTarget) {
  StepBudget budget(Options());
  for (int64_t tokens : {200, 1, 1, 40, 1, 80, 17, 300}) budget.ObserveStep(tokens, StepTime(tokens));
  EXPECT_NEAR(absl::ToDoubleMilliseconds(budget.fixed_cost()), 10.0, 1e-6);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(budget.per_token_cost()), 100.0, 1e-6);
  // Target 2 x (10 + 0.1) = 20.2 ms; beside 16 decode tokens (11.6 ms) there is room for
  // 8.6 ms / 0.1 ms = 86 prompt tokens.
  EXPECT_NEAR(absl::ToDoubleMilliseconds(budget.target_step_time()), 20.2, 1e-6);
  EXPECT_NEAR(budget.PromptTokens(16, absl::ZeroDuration()), 86, 1);
  // The predicted step time of that pack meets the target.
  const int64_t prompt = budget.PromptTokens(16, absl::ZeroDuration());
  EXPECT_LE(StepTime(16 + prompt), budget.target_step_time() + absl::Microseconds(1));
}

// Where a lone token costs less than the line says (it reads only its own experts), the target
// follows the measured one-token steps.
TEST(StepBudgetTest, TheAutomaticTargetIsMeasuredOnOneTokenSteps) {
  StepBudget budget(Options());
  for (int64_t tokens : {16, 100, 16, 100}) budget.ObserveStep(tokens, StepTime(tokens));
  EXPECT_NEAR(absl::ToDoubleMilliseconds(budget.target_step_time()), 20.2, 1e-6);
  budget.ObserveStep(1, absl::Milliseconds(6));
  EXPECT_NEAR(absl::ToDoubleMilliseconds(budget.target_step_time()), 12.0, 1e-6);
  // Beside 16 decode tokens (11.6 ms on the line) that leaves 0.4 ms: 4 tokens, so the floor.
  EXPECT_EQ(budget.PromptTokens(16, absl::ZeroDuration()), 16);
}

TEST(StepBudgetTest, AnExplicitTargetWins) {
  StepBudgetOptions options = Options();
  options.target = absl::Milliseconds(50);
  StepBudget budget(options);
  for (int64_t tokens : {1, 100, 1, 100}) budget.ObserveStep(tokens, StepTime(tokens));
  // (50 - 10 - 0.1 x 4) / 0.1 = 396, capped at twice the largest recent step plus the floor (216).
  EXPECT_EQ(budget.PromptTokens(4, absl::ZeroDuration()), 216);
  budget.ObserveStep(300, StepTime(300));
  EXPECT_NEAR(budget.PromptTokens(4, absl::ZeroDuration()), 396, 1);
}

TEST(StepBudgetTest, NeverBelowTheFloorWhenDecodeAloneMissesTheTarget) {
  StepBudget budget(Options());
  for (int64_t tokens : {1, 100, 1, 100}) budget.ObserveStep(tokens, StepTime(tokens));
  // 200 decode tokens take 30 ms, past the 20.2 ms target: prompts still get the floor.
  EXPECT_EQ(budget.PromptTokens(200, absl::ZeroDuration()), 16);
}

TEST(StepBudgetTest, AnOverdueQueueGrowsTheBudget) {
  StepBudget budget(Options());
  for (int64_t tokens : {1, 300, 1, 300}) budget.ObserveStep(tokens, StepTime(tokens));
  const int64_t on_time = budget.PromptTokens(16, absl::Seconds(1));
  EXPECT_NEAR(on_time, 86, 1);
  EXPECT_NEAR(budget.PromptTokens(16, absl::Seconds(4)), 2 * on_time, 2);
  // Even with no room at all under the target.
  EXPECT_EQ(budget.PromptTokens(200, absl::Seconds(6)), 48);
}

TEST(StepBudgetTest, FollowsAMachineThatSlowsDown) {
  StepBudget budget(Options());
  for (int i = 0; i < 20; ++i) {
    for (int64_t tokens : {1, 64}) budget.ObserveStep(tokens, StepTime(tokens));
  }
  const int64_t before = budget.PromptTokens(8, absl::ZeroDuration());
  for (int i = 0; i < 40; ++i) {
    for (int64_t tokens : {1, 64}) budget.ObserveStep(tokens, StepTime(tokens) + StepTime(tokens));
  }
  // Twice as slow per token and fixed: the target doubles too, so the budget stays about the
  // same; the fit follows the new line.
  EXPECT_NEAR(absl::ToDoubleMilliseconds(budget.fixed_cost()), 20.0, 0.5);
  EXPECT_NEAR(budget.PromptTokens(8, absl::ZeroDuration()), before, 3);
}

TEST(StepBudgetTest, RejectsBadOptions) {
  StepBudgetOptions options = Options();
  options.target_factor = 0.5;
  EXPECT_FALSE(options.Validate().ok());
  options = Options();
  options.ttft_target = absl::ZeroDuration();
  EXPECT_FALSE(options.Validate().ok());
  options = Options();
  options.decay = 1.0;
  EXPECT_FALSE(options.Validate().ok());
}

}  // namespace
}  // namespace k3
