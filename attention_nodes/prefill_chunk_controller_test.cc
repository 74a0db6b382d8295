#include "attention_nodes/prefill_chunk_controller.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace k3 {
namespace {

PrefillChunkOptions Options() {
  PrefillChunkOptions options;
  options.min_chunk = 16;
  options.max_chunk = 2048;
  options.granule = 16;
  options.target_factor = 2.0;
  options.smoothing = 1.0;  // the newest measurement only: exact expectations
  return options;
}

// A fake machine: a step costs `base` plus `per_token` per prefill token.
absl::Duration StepTime(absl::Duration base, absl::Duration per_token, int64_t prefill) {
  return base + per_token * prefill;
}

TEST(PrefillChunkControllerTest, FloorBeforeAnyMeasurementAndBudgetWithoutDecoders) {
  PrefillChunkController controller(Options());
  EXPECT_EQ(controller.ChunkTokens(true), 16);
  EXPECT_EQ(controller.ChunkTokens(false), 2048);
}

TEST(PrefillChunkControllerTest, GrowsAQuarterOrAGranuleAStepToTheChunkThatMeetsTheTarget) {
  PrefillChunkController controller(Options());
  const absl::Duration base = absl::Milliseconds(10);
  const absl::Duration per_token = absl::Microseconds(100);
  controller.ObserveStep(4, 0, base);
  EXPECT_EQ(controller.decode_step_time(), base);
  EXPECT_EQ(controller.target_step_time(), absl::Milliseconds(20));
  // Target 20 ms: 10 ms of room / 0.1 ms a token = 100 tokens, 96 in granules of 16.
  const int64_t expected[] = {32, 48, 64, 80, 96, 96, 96};
  int64_t chunk = controller.ChunkTokens(true);
  EXPECT_EQ(chunk, 16);
  for (int64_t want : expected) {
    controller.ObserveStep(4, chunk, StepTime(base, per_token, chunk));
    EXPECT_EQ(controller.per_prefill_token(), per_token);
    chunk = controller.ChunkTokens(true);
    EXPECT_EQ(chunk, want);
  }
  EXPECT_LE(StepTime(base, per_token, chunk), controller.target_step_time());
  EXPECT_EQ(controller.ChunkTokens(false), 2048);  // no decoders: the whole budget
}

// Below a granule the chunk grows a token (or a quarter) a step, then a granule at a time.
TEST(PrefillChunkControllerTest, SmallChunksGrowByATokenThenByGranules) {
  PrefillChunkOptions options = Options();
  options.min_chunk = 1;
  PrefillChunkController controller(options);
  const absl::Duration base = absl::Milliseconds(10);
  controller.ObserveStep(4, 0, base);
  const int64_t expected[] = {2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 32, 48};
  int64_t chunk = controller.ChunkTokens(true);
  EXPECT_EQ(chunk, 1);
  for (int64_t want : expected) {
    controller.ObserveStep(4, chunk, StepTime(base, absl::Microseconds(1), chunk));
    chunk = controller.ChunkTokens(true);
    EXPECT_EQ(chunk, want);
  }
}

TEST(PrefillChunkControllerTest, ShrinksAtMostByHalfDownToTheFloorAsTokensGetDearer) {
  PrefillChunkOptions options = Options();
  options.max_chunk = 512;
  PrefillChunkController controller(options);
  const absl::Duration base = absl::Milliseconds(10);
  controller.ObserveStep(4, 0, base);
  int64_t chunk = controller.ChunkTokens(true);
  for (int i = 0; i < 40; ++i) {  // cheap tokens: up to max_chunk
    controller.ObserveStep(4, chunk, StepTime(base, absl::Microseconds(1), chunk));
    chunk = controller.ChunkTokens(true);
  }
  EXPECT_EQ(chunk, 512);
  // Each token now costs the whole decode step (a long prefix): the chunk halves each step
  // and stops at the floor.
  const int64_t expected[] = {256, 128, 64, 32, 16, 16};
  for (int64_t want : expected) {
    controller.ObserveStep(4, chunk, StepTime(base, base, chunk));
    chunk = controller.ChunkTokens(true);
    EXPECT_EQ(chunk, want);
  }
}

TEST(PrefillChunkControllerTest, RespectsMaxChunkAndMinTarget) {
  PrefillChunkOptions options = Options();
  options.max_chunk = 100;  // not a multiple of the granule: 96 is the largest chunk
  options.min_target = absl::Milliseconds(50);
  PrefillChunkController controller(options);
  controller.ObserveStep(2, 0, absl::Milliseconds(1));
  EXPECT_EQ(controller.target_step_time(), absl::Milliseconds(50));
  int64_t chunk = controller.ChunkTokens(true);
  for (int i = 0; i < 10; ++i) {
    controller.ObserveStep(2, chunk, StepTime(absl::Milliseconds(1), absl::Microseconds(10),
                                              chunk));
    chunk = controller.ChunkTokens(true);
  }
  EXPECT_EQ(chunk, 96);
}

TEST(PrefillChunkControllerTest, FloorStepsStandInForTheDecodeOnlyTime) {
  PrefillChunkController controller(Options());
  const absl::Duration base = absl::Milliseconds(8);
  // A step with a larger chunk and no decode-only reference teaches nothing.
  controller.ObserveStep(4, 64, absl::Milliseconds(40));
  EXPECT_EQ(controller.decode_step_time(), absl::ZeroDuration());
  EXPECT_EQ(controller.ChunkTokens(true), 16);
  controller.ObserveStep(4, 16, base);
  EXPECT_EQ(controller.decode_step_time(), base);
  EXPECT_EQ(controller.target_step_time(), absl::Milliseconds(16));
  // Steps without decode tokens say nothing about decoding.
  controller.ObserveStep(0, 2048, absl::Seconds(3));
  EXPECT_EQ(controller.decode_step_time(), base);
  // A real decode-only step replaces the stand-in.
  controller.ObserveStep(4, 0, absl::Milliseconds(5));
  EXPECT_EQ(controller.decode_step_time(), absl::Milliseconds(5));
}

TEST(PrefillChunkControllerTest, SmoothsDecodeStepTimes) {
  PrefillChunkOptions options = Options();
  options.smoothing = 0.5;
  PrefillChunkController controller(options);
  controller.ObserveStep(4, 0, absl::Milliseconds(10));
  controller.ObserveStep(4, 0, absl::Milliseconds(20));
  EXPECT_EQ(controller.decode_step_time(), absl::Milliseconds(15));
}

TEST(PrefillChunkControllerTest, ValidateNamesTheBadField) {
  PrefillChunkOptions options = Options();
  options.max_chunk = 8;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = Options();
  options.target_factor = 0.5;
  EXPECT_NE(options.Validate().message().find("target_factor"), std::string::npos);
  options = Options();
  options.smoothing = 0;
  EXPECT_NE(options.Validate().message().find("smoothing"), std::string::npos);
  EXPECT_TRUE(Options().Validate().ok());
}

}  // namespace
}  // namespace k3
