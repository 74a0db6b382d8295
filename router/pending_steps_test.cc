#include "router/pending_steps.h"

#include <memory>

#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr int64_t kWidth = 3;

// A step of `id` that sent rows[w] rows to nodes[w] (node 0: no rows for that slot).
std::unique_ptr<PendingStep> MakeStep(uint64_t id, std::vector<PeerId> nodes,
                                      std::vector<int> rows, absl::Time deadline) {
  auto step = std::make_unique<PendingStep>();
  step->id = id;
  step->origin = 100;
  step->origin_step = id * 10;
  step->deadline = deadline;
  step->step.width = kWidth;
  step->step.plan.workers.resize(nodes.size());
  for (size_t w = 0; w < nodes.size(); ++w) {
    step->step.plan.workers[w].tokens.assign(rows[w], 0);
    if (nodes[w] != 0) ++step->outstanding;
  }
  for (PeerId node : nodes) {
    step->AddSlot();
    step->nodes.back() = node;
  }
  return step;
}

// An answer of `rows` rows to slot `slot` of step `step`, encoded.
std::string Answer(uint64_t step, size_t slot, int64_t rows, float value) {
  ExpertResponse response;
  response.step_id = SlotRequestId(step, slot);
  response.rows_count = rows;
  response.width = kWidth;
  response.rows.assign(rows * kWidth, value);
  return Encode(response);
}

// The partial sums a finished step holds for `slot`, copied out (empty without an answer).
std::vector<float> PartialOf(const PendingStep& step, size_t slot) {
  const float* partial = step.Partial(slot);
  if (partial == nullptr) return {};
  return std::vector<float>(partial, partial + step.step.plan.workers[slot].tokens.size() * kWidth);
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(PendingStepsTest, CompletesWhenEveryWorkerAnsweredInAnyOrder) {
  PendingSteps table;
  table.Add(MakeStep(1, {7, 0, 9}, {2, 0, 1}, kT0));
  EXPECT_EQ(table.size(), 1u);
  PendingSteps::Answer first = table.OnAnswer(9, Answer(1, 2, 1, 2.5f));
  EXPECT_EQ(first.outcome, PendingSteps::Outcome::kWaiting);
  EXPECT_EQ(first.step, nullptr);
  PendingSteps::Answer second = table.OnAnswer(7, Answer(1, 0, 2, -1.f));
  ASSERT_EQ(second.outcome, PendingSteps::Outcome::kComplete);
  ASSERT_NE(second.step, nullptr);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(second.step->origin_step, 10u);
  EXPECT_EQ(PartialOf(*second.step, 0), std::vector<float>(2 * kWidth, -1.f));
  EXPECT_TRUE(PartialOf(*second.step, 1).empty());
  EXPECT_EQ(PartialOf(*second.step, 2), std::vector<float>(kWidth, 2.5f));
}

// Slot 0's rows went again to node 9 (its node died) besides node 9's own slot 1: each answer
// finds its slot by its request id, in whatever order they come.
TEST(PendingStepsTest, ANodeOwingSeveralSlotsHasEachAnswerMatchedByItsRequestId) {
  PendingSteps table;
  table.Add(MakeStep(1, {9, 9}, {2, 1}, kT0));
  EXPECT_EQ(table.OnAnswer(9, Answer(1, 0, 2, 4.f)).outcome, PendingSteps::Outcome::kWaiting);
  PendingSteps::Answer done = table.OnAnswer(9, Answer(1, 1, 1, 3.f));
  ASSERT_EQ(done.outcome, PendingSteps::Outcome::kComplete) << done.error;
  EXPECT_EQ(PartialOf(*done.step, 0), std::vector<float>(2 * kWidth, 4.f));
  EXPECT_EQ(PartialOf(*done.step, 1), std::vector<float>(kWidth, 3.f));
}

// Slot 1 went from node 9 (slow) to node 7, which also holds slot 0. Node 9's late answer for
// slot 1 is the same rows' partials: it counts, and node 7's later one is dropped. An error
// from node 9 about a slot it no longer holds does not fail the step.
TEST(PendingStepsTest, AnAnswerFromTheSlotsFormerNodeCountsOnlyWhenWellFormed) {
  PendingSteps table;
  table.Add(MakeStep(1, {7, 7}, {2, 1}, kT0));
  ExpertResponse error;
  error.step_id = SlotRequestId(1, 1);
  error.status = absl::FailedPreconditionError("placement moved on");
  EXPECT_EQ(table.OnAnswer(9, Encode(error)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.OnAnswer(9, Answer(1, 1, 2, 0.f)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.OnAnswer(9, Answer(1, 1, 1, 5.f)).outcome, PendingSteps::Outcome::kWaiting);
  EXPECT_EQ(table.OnAnswer(7, Answer(1, 1, 1, 6.f)).outcome, PendingSteps::Outcome::kDropped);
  PendingSteps::Answer done = table.OnAnswer(7, Answer(1, 0, 2, 1.f));
  ASSERT_EQ(done.outcome, PendingSteps::Outcome::kComplete) << done.error;
  EXPECT_EQ(PartialOf(*done.step, 1), std::vector<float>(kWidth, 5.f));
}

TEST(PendingStepsTest, DropsLateDuplicateAndUnknownAnswers) {
  PendingSteps table;
  table.Add(MakeStep(1, {7, 9, 0}, {1, 1, 0}, kT0));
  EXPECT_EQ(table.OnAnswer(7, Answer(2, 0, 1, 0.f)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.OnAnswer(7, Answer(1, 2, 0, 0.f)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.OnAnswer(7, Answer(1, 3, 1, 0.f)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.OnAnswer(7, Answer(1, 0, 1, 0.f)).outcome, PendingSteps::Outcome::kWaiting);
  EXPECT_EQ(table.OnAnswer(7, Answer(1, 0, 1, 0.f)).outcome, PendingSteps::Outcome::kDropped);
  EXPECT_EQ(table.size(), 1u);
}

TEST(PendingStepsTest, WorkerErrorsAndBadShapesFailTheStep) {
  PendingSteps table;
  table.Add(MakeStep(1, {7, 9}, {2, 1}, kT0));
  table.Add(MakeStep(2, {7, 9}, {2, 1}, kT0));
  ExpertResponse error;
  error.step_id = SlotRequestId(1, 1);
  error.status = absl::FailedPreconditionError("expert 3 is not hosted");
  PendingSteps::Answer failed = table.OnAnswer(9, Encode(error));
  ASSERT_EQ(failed.outcome, PendingSteps::Outcome::kFailed);
  EXPECT_EQ(failed.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failed.step->id, 1u);
  PendingSteps::Answer malformed = table.OnAnswer(7, Answer(2, 0, 1, 0.f));  // owes 2 rows
  ASSERT_EQ(malformed.outcome, PendingSteps::Outcome::kFailed);
  EXPECT_EQ(malformed.error.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(table.size(), 0u);

  // A message that is not a well-formed ExpertResponse but names its step fails the step too.
  table.Add(MakeStep(3, {7}, {1}, kT0));
  std::string truncated = Answer(3, 0, 1, 0.f);
  truncated.pop_back();
  PendingSteps::Answer cut = table.OnAnswer(7, truncated);
  ASSERT_EQ(cut.outcome, PendingSteps::Outcome::kFailed);
  EXPECT_EQ(cut.error.code(), absl::StatusCode::kInternal);
  EXPECT_NE(cut.error.message().find("malformed answer"), std::string::npos) << cut.error;
}

TEST(PendingStepsTest, TakeWaitingOnTakesOnlyStepsTheNodeStillOwes) {
  PendingSteps table;
  table.Add(MakeStep(1, {7, 9}, {1, 1}, kT0));
  table.Add(MakeStep(2, {7, 9}, {1, 1}, kT0));
  table.Add(MakeStep(3, {0, 9}, {0, 1}, kT0));
  ASSERT_EQ(table.OnAnswer(7, Answer(2, 0, 1, 0.f)).outcome, PendingSteps::Outcome::kWaiting);
  EXPECT_EQ(table.AwaitedNodes(), (std::vector<PeerId>{7, 9}));
  std::vector<std::unique_ptr<PendingStep>> lost = table.TakeWaitingOn(7);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0]->id, 1u);
  EXPECT_EQ(PendingSteps::Unanswered(*lost[0]), (std::vector<PeerId>{7, 9}));
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.AwaitedNodes(), (std::vector<PeerId>{9}));
  EXPECT_EQ(table.TakeWaitingOn(9).size(), 2u);
  EXPECT_EQ(table.size(), 0u);
}

TEST(PendingStepsTest, ExpiresByDeadline) {
  PendingSteps table;
  EXPECT_EQ(table.NextDeadline(), absl::InfiniteFuture());
  table.Add(MakeStep(1, {7}, {1}, kT0 + absl::Seconds(2)));
  table.Add(MakeStep(2, {7}, {1}, kT0 + absl::Seconds(1)));
  table.Add(MakeStep(3, {7}, {1}, kT0 + absl::Seconds(3)));
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(1));
  EXPECT_TRUE(table.TakeExpired(kT0).empty());
  std::vector<std::unique_ptr<PendingStep>> expired = table.TakeExpired(kT0 + absl::Seconds(2));
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0]->id, 1u);
  EXPECT_EQ(expired[1]->id, 2u);
  EXPECT_EQ(table.NextDeadline(), kT0 + absl::Seconds(3));
  EXPECT_EQ(table.TakeAll().size(), 1u);
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace k3
