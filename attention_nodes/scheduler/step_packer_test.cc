#include "attention_nodes/scheduler/step_packer.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

PackInput Decoding() { return {5, 5}; }
PackInput Prompt(int64_t tokens, int64_t consumed = 0) { return {tokens, consumed}; }

PackLimits Limits(int64_t max_tokens, int64_t prompt_budget, int64_t granule = 1) {
  PackLimits limits;
  limits.max_tokens = max_tokens;
  limits.prompt_budget = prompt_budget;
  limits.prompt_floor = 1;
  limits.granule = granule;
  return limits;
}

// The chunk each sequence gets (0 for none), by index.
std::vector<int64_t> Chunks(const StepPack& pack, size_t count) {
  std::vector<int64_t> tokens(count, 0);
  for (const PrefillChunk& chunk : pack.prefill) tokens[chunk.index] = chunk.tokens;
  return tokens;
}

TEST(StepPackerTest, EveryDecoderGetsATokenAndPromptsShareTheBudget) {
  StepPacker packer;
  const std::vector<PackInput> running = {Decoding(), Prompt(100), Decoding(), Prompt(30)};
  const StepPack pack = packer.Pack(running, Limits(2048, 40));
  EXPECT_EQ(pack.decode, (std::vector<size_t>{0, 2}));
  // The oldest prompt gets half (20); the 30-token prompt does not fit in the other 20, so the
  // rest goes in arrival order: the oldest again.
  EXPECT_EQ(Chunks(pack, 4), (std::vector<int64_t>{0, 40, 0, 0}));
  EXPECT_EQ(pack.tokens(), 42);
}

TEST(StepPackerTest, ShortPromptsThatFitCompleteFirstAfterTheOldestsShare) {
  StepPacker packer;
  const std::vector<PackInput> running = {Decoding(), Prompt(1000), Prompt(50), Prompt(8),
                                          Prompt(20)};
  const StepPack pack = packer.Pack(running, Limits(2048, 64));
  // Oldest: 32; then whole prompts shortest first out of 32: 8, 20 (28); the 4 left to the
  // oldest in arrival order.
  EXPECT_EQ(Chunks(pack, 5), (std::vector<int64_t>{0, 36, 0, 8, 20}));
  for (const PrefillChunk& chunk : pack.prefill) {
    EXPECT_EQ(chunk.completes, chunk.index == 3 || chunk.index == 4) << chunk.index;
  }
}

TEST(StepPackerTest, NeverExceedsTheBudgetOrTheStepLimit) {
  StepPacker packer;
  std::vector<PackInput> running;
  for (int i = 0; i < 10; ++i) running.push_back(Decoding());
  for (int i = 0; i < 10; ++i) running.push_back(Prompt(37 + i, i));
  for (int64_t budget : {0, 1, 5, 17, 100, 5000}) {
    for (int64_t max_tokens : {1, 4, 11, 64, 2048}) {
      const StepPack pack = packer.Pack(running, Limits(max_tokens, budget, 16));
      EXPECT_LE(pack.tokens(), max_tokens);
      EXPECT_LE(pack.prefill_tokens(), budget);
      for (const PrefillChunk& chunk : pack.prefill) {
        EXPECT_GE(chunk.tokens, 1);
        EXPECT_LE(chunk.tokens, running[chunk.index].prompt_tokens - running[chunk.index].consumed);
      }
    }
  }
}

TEST(StepPackerTest, AFullStepOfDecodersRotatesAndKeepsAFloorForPrompts) {
  StepPacker packer;
  std::vector<PackInput> running(5, Decoding());
  running.push_back(Prompt(10));
  PackLimits limits = Limits(4, 100);
  limits.prompt_floor = 1;
  std::vector<int> decoded(5, 0);
  for (int step = 0; step < 5; ++step) {
    const StepPack pack = packer.Pack(running, limits);
    EXPECT_EQ(pack.decode_tokens(), 3);  // one token kept for the prompt
    EXPECT_EQ(pack.prefill_tokens(), 1);
    for (size_t i : pack.decode) ++decoded[i];
  }
  // 15 decode tokens over 5 decoders in rotation: three each.
  EXPECT_EQ(decoded, (std::vector<int>(5, 3)));
}

TEST(StepPackerTest, PartialChunksEndOnGranuleBoundaries) {
  StepPacker packer;
  // Consumed 5 of 100: a 40-token grant ends at 32 (27 tokens), not 45.
  const std::vector<PackInput> running = {Decoding(), Prompt(100, 5)};
  StepPack pack = packer.Pack(running, Limits(2048, 40, 16));
  EXPECT_EQ(Chunks(pack, 2), (std::vector<int64_t>{0, 27}));
  // A grant shorter than the way to the next boundary is kept as it is: the prompt progresses.
  pack = packer.Pack(running, Limits(2048, 7, 16));
  EXPECT_EQ(Chunks(pack, 2), (std::vector<int64_t>{0, 7}));
  // The end of the prompt needs no boundary.
  const std::vector<PackInput> tail = {Decoding(), Prompt(100, 90)};
  pack = packer.Pack(tail, Limits(2048, 40, 16));
  EXPECT_EQ(Chunks(pack, 2), (std::vector<int64_t>{0, 10}));
  EXPECT_TRUE(pack.prefill[0].completes);
}

// With a chunk (batch invariance: KDA's grid), partial chunks always end on it: back to a chunk
// boundary when the granule's is out of reach, else on to the next one past the budget.
TEST(StepPackerTest, WithAChunkPartialChunksAlwaysEndOnItsGrid) {
  StepPacker packer;
  const std::vector<PackInput> running = {Decoding(), Prompt(100, 16)};
  PackLimits limits = Limits(2048, 40, 64);
  limits.chunk = 16;
  // Granule 64 cuts 48 tokens (16 + 48 = 64) where it can.
  limits.prompt_budget = 60;
  EXPECT_EQ(Chunks(packer.Pack(running, limits), 2), (std::vector<int64_t>{0, 48}));
  // 40 cannot reach 64: back to 48 (32 tokens), a multiple of the chunk.
  limits.prompt_budget = 40;
  EXPECT_EQ(Chunks(packer.Pack(running, limits), 2), (std::vector<int64_t>{0, 32}));
  // 7 cannot reach 32: on to it (16 tokens, 9 past the budget) rather than cutting at 23.
  limits.prompt_budget = 7;
  EXPECT_EQ(Chunks(packer.Pack(running, limits), 2), (std::vector<int64_t>{0, 16}));
  // Never past the prompt's end.
  const std::vector<PackInput> tail = {Decoding(), Prompt(100, 90)};
  limits.prompt_budget = 3;
  EXPECT_EQ(Chunks(packer.Pack(tail, limits), 2), (std::vector<int64_t>{0, 6}));
}

TEST(StepPackerTest, WithoutDecodersPromptsTakeTheWholeBudgetInArrivalOrder) {
  StepPacker packer;
  const std::vector<PackInput> running = {Prompt(300), Prompt(300)};
  const StepPack pack = packer.Pack(running, Limits(512, 512));
  EXPECT_TRUE(pack.decode.empty());
  EXPECT_EQ(Chunks(pack, 2), (std::vector<int64_t>{300, 212}));
}

// The oldest prompt progresses every step however many short prompts keep arriving.
TEST(StepPackerTest, ALongPromptIsNotStarvedByShortOnes) {
  StepPacker packer;
  std::vector<PackInput> running = {Decoding(), Prompt(200)};
  for (int i = 0; i < 20; ++i) running.push_back(Prompt(3));
  int64_t consumed = 0;
  for (int step = 0; step < 10; ++step) {
    running[1].consumed = consumed;
    const StepPack pack = packer.Pack(running, Limits(2048, 24));
    const int64_t got = Chunks(pack, running.size())[1];
    EXPECT_GE(got, 12);
    consumed += got;
  }
  EXPECT_GE(consumed, 120);
}

}  // namespace
}  // namespace k3
