// The device grouping (moe_group_kernel.inc) run on the CPU under simt_emulation.h, against the
// host grouping GpuExpertCompute::Run uses (GroupSlotsByExpert, moe_grouping.h) on the same
// assignments: the same slots (row and weight, exactly), the same chunks, and the rest of the
// chunk array empty; and the row gather against kernels/bf16.h's rounding, bit for bit.
#include "kernels/cuda/simt_emulation.h"
// After the emulation, which defines what the device code uses of CUDA.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/moe_combine_kernel.inc"
#include "kernels/cuda/moe_group_kernel.inc"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cuda/moe_grouping.h"

namespace k3 {
namespace {

struct Routing {
  std::vector<int32_t> ids;  // [rows, top_k]
  std::vector<float> weights;
};

// Each row picks top_k distinct experts: random ones, or (skewed) the first top_k for every row.
Routing RandomRouting(int rows, int top_k, int experts, bool skewed, std::mt19937& rng) {
  Routing r;
  std::vector<int32_t> ids(experts);
  std::iota(ids.begin(), ids.end(), 0);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  for (int row = 0; row < rows; ++row) {
    if (!skewed) std::shuffle(ids.begin(), ids.end(), rng);
    for (int k = 0; k < top_k; ++k) {
      r.ids.push_back(ids[k]);
      r.weights.push_back(weight(rng));
    }
  }
  return r;
}

void ExpectGroupingMatchesHost(int rows, int top_k, int experts, int chunk_tokens, bool skewed) {
  SCOPED_TRACE(::testing::Message()
               << rows << " rows, top " << top_k << " of " << experts << ", chunks of "
               << chunk_tokens << (skewed ? ", skewed" : ""));
  std::mt19937 rng(rows * 1000 + top_k * 10 + experts);
  const Routing routing = RandomRouting(rows, top_k, experts, skewed, rng);
  std::vector<int32_t> table_index(experts);  // a permutation, so that the mapping shows
  for (int e = 0; e < experts; ++e) table_index[e] = (e * 7 + 3) % experts;
  if (experts % 7 == 0) std::iota(table_index.begin(), table_index.end(), 0);

  const int slots = rows * top_k;
  const int max_chunks = MoeGroupMaxChunks(rows, top_k, experts, chunk_tokens);
  std::vector<int32_t> slot_row(slots, -1);
  std::vector<float> slot_weight(slots, NAN);
  std::vector<int32_t> row_slots(slots, -9);
  std::vector<MoeChunk> chunks(max_chunks, MoeChunk{-5, -5, -5});
  MoeGroupArgs args;
  args.row_slots = row_slots.data();
  args.ids = routing.ids.data();
  args.weights = routing.weights.data();
  args.rows = rows;
  args.top_k = top_k;
  args.table_index = table_index.data();
  args.num_experts = experts;
  args.chunk_tokens = chunk_tokens;
  args.max_chunks = max_chunks;
  args.slot_row = slot_row.data();
  args.slot_weight = slot_weight.data();
  args.chunks = chunks.data();
  simt::RunGrid({1, 1, 1}, {kMoeGroupThreads, 1, 1}, [&] { MoeGroupKernel(args); });

  const MoeSlots want = GroupSlotsByExpert(routing.ids, table_index, chunk_tokens);
  ASSERT_EQ(want.order.size(), static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    EXPECT_EQ(slot_row[s], want.order[s] / top_k) << "slot " << s;
    EXPECT_EQ(slot_weight[s], routing.weights[want.order[s]]) << "slot " << s;
    EXPECT_EQ(row_slots[want.order[s]], s) << "slot " << s;  // the inverse of the grouping
  }
  ASSERT_LE(want.chunks.size(), chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    const MoeChunk expected = c < want.chunks.size() ? want.chunks[c] : MoeChunk{};
    EXPECT_EQ(chunks[c].expert, expected.expert) << "chunk " << c;
    EXPECT_EQ(chunks[c].first_slot, expected.first_slot) << "chunk " << c;
    EXPECT_EQ(chunks[c].tokens, expected.tokens) << "chunk " << c;
  }
}

TEST(MoeGroupEmulationTest, DecodeSizedRoutingMatchesTheHostGrouping) {
  for (int rows : {1, 8, 32}) ExpectGroupingMatchesHost(rows, 16, 64, 32, false);
  ExpectGroupingMatchesHost(5, 4, 32, 8, false);
  ExpectGroupingMatchesHost(3, 8, 896, 8, false);  // K3's expert count
}

TEST(MoeGroupEmulationTest, LargeGroupsSplitIntoChunks) {
  ExpectGroupingMatchesHost(40, 4, 16, 8, true);   // 40 rows per expert: 5 chunks each
  ExpectGroupingMatchesHost(40, 4, 16, 16, true);  // 2 full chunks and one of 8
  ExpectGroupingMatchesHost(70, 16, 64, 32, false);
}

// The host grouping itself on a case worked by hand: assignments to experts 3, 1, 3, 1, 1 (the
// kernels' indices 30 and 10): expert 1's slots first, each expert's in assignment order.
TEST(MoeGroupEmulationTest, HostGroupingOnAHandCase) {
  std::vector<int32_t> table_index(4, -1);
  table_index[1] = 10;
  table_index[3] = 30;
  const MoeSlots slots = GroupSlotsByExpert({3, 1, 3, 1, 1}, table_index, 0);
  EXPECT_EQ(slots.order, (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(slots.chunk_tokens, 8);  // the largest group has 3 slots
  ASSERT_EQ(slots.chunks.size(), 2u);
  EXPECT_EQ(slots.chunks[0].expert, 10);
  EXPECT_EQ(slots.chunks[0].first_slot, 0);
  EXPECT_EQ(slots.chunks[0].tokens, 3);
  EXPECT_EQ(slots.chunks[1].expert, 30);
  EXPECT_EQ(slots.chunks[1].first_slot, 3);
  EXPECT_EQ(slots.chunks[1].tokens, 2);
  // Chunks of 8 cut a group of 17 into 8 + 8 + 1; sizes up to 8, 16, 32 and beyond pick 8..32.
  const MoeSlots long_group = GroupSlotsByExpert(std::vector<int32_t>(17, 1), table_index, 8);
  ASSERT_EQ(long_group.chunks.size(), 3u);
  EXPECT_EQ(long_group.chunks[2].first_slot, 16);
  EXPECT_EQ(long_group.chunks[2].tokens, 1);
  EXPECT_EQ(MoeChunkTokensFor(8), 8);
  EXPECT_EQ(MoeChunkTokensFor(9), 16);
  EXPECT_EQ(MoeChunkTokensFor(17), 32);
  EXPECT_EQ(MoeChunkTokensFor(500), 32);
}

// Ids out of range are dropped, yet every slot is written with an in-range row, so the gather
// never reads an unwritten slot: the kept assignments as the host groups them, then the dropped
// ones in assignment order with weight 0 and no chunk.
TEST(MoeGroupEmulationTest, OutOfRangeIdsTakeTheLastSlotsWithNoChunk) {
  const int rows = 3, top_k = 2, experts = 4, chunk_tokens = 8;
  const std::vector<int32_t> ids = {2, -1, 1, 4, 2, 1};
  const std::vector<float> weights = {0.5f, 0.25f, 0.125f, 2.0f, 4.0f, 8.0f};
  const std::vector<int32_t> table_index = {0, 1, 2, 3};
  const int max_chunks = MoeGroupMaxChunks(rows, top_k, experts, chunk_tokens);
  std::vector<int32_t> slot_row(rows * top_k, -7);
  std::vector<float> slot_weight(rows * top_k, NAN);
  std::vector<int32_t> row_slots(rows * top_k, -9);
  std::vector<MoeChunk> chunks(max_chunks, MoeChunk{-5, -5, -5});
  MoeGroupArgs args;
  args.row_slots = row_slots.data();
  args.ids = ids.data();
  args.weights = weights.data();
  args.rows = rows;
  args.top_k = top_k;
  args.table_index = table_index.data();
  args.num_experts = experts;
  args.chunk_tokens = chunk_tokens;
  args.max_chunks = max_chunks;
  args.slot_row = slot_row.data();
  args.slot_weight = slot_weight.data();
  args.chunks = chunks.data();
  simt::RunGrid({1, 1, 1}, {kMoeGroupThreads, 1, 1}, [&] { MoeGroupKernel(args); });
  // Expert 1: assignments 2, 5 (rows 1, 2); expert 2: 0, 4 (rows 0, 2); dropped: 1, 3 (rows 0, 1).
  EXPECT_EQ(slot_row, (std::vector<int32_t>{1, 2, 0, 2, 0, 1}));
  EXPECT_EQ(slot_weight, (std::vector<float>{0.125f, 8.0f, 0.5f, 4.0f, 0.0f, 0.0f}));
  EXPECT_EQ(row_slots, (std::vector<int32_t>{2, -1, 0, -1, 3, 1}));  // dropped ones: none
  EXPECT_EQ(chunks[0].expert, 1);
  EXPECT_EQ(chunks[0].first_slot, 0);
  EXPECT_EQ(chunks[0].tokens, 2);
  EXPECT_EQ(chunks[1].expert, 2);
  EXPECT_EQ(chunks[1].first_slot, 2);
  EXPECT_EQ(chunks[1].tokens, 2);
  for (int c = 2; c < max_chunks; ++c) EXPECT_EQ(chunks[c].tokens, 0) << "chunk " << c;
}

// Experts this node does not hold (table_index -1) keep their slots but get no work (an empty
// chunk) and no place in their rows' sums.
TEST(MoeGroupEmulationTest, ExpertsNotHeldAreLeftOutOfTheRowSums) {
  const int rows = 2, top_k = 2, experts = 3, chunk_tokens = 8;
  const std::vector<int32_t> ids = {0, 2, 2, 1};
  const std::vector<float> weights = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<int32_t> table_index = {0, -1, 1};
  const int max_chunks = MoeGroupMaxChunks(rows, top_k, experts, chunk_tokens);
  std::vector<int32_t> slot_row(rows * top_k, -7), row_slots(rows * top_k, -9);
  std::vector<float> slot_weight(rows * top_k, NAN);
  std::vector<MoeChunk> chunks(max_chunks, MoeChunk{-5, -5, -5});
  MoeGroupArgs args;
  args.ids = ids.data();
  args.weights = weights.data();
  args.rows = rows;
  args.top_k = top_k;
  args.table_index = table_index.data();
  args.num_experts = experts;
  args.chunk_tokens = chunk_tokens;
  args.max_chunks = max_chunks;
  args.slot_row = slot_row.data();
  args.slot_weight = slot_weight.data();
  args.row_slots = row_slots.data();
  args.chunks = chunks.data();
  simt::RunGrid({1, 1, 1}, {kMoeGroupThreads, 1, 1}, [&] { MoeGroupKernel(args); });
  // Slots: expert 0 (assignment 0), expert 1 (3, not held), expert 2 (1, 2).
  EXPECT_EQ(slot_row, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(row_slots, (std::vector<int32_t>{0, 2, 3, -1}));
  EXPECT_EQ(chunks[1].tokens, 0);  // expert 1's
  EXPECT_EQ(chunks[2].expert, 1);
  EXPECT_EQ(chunks[2].first_slot, 2);
  EXPECT_EQ(chunks[2].tokens, 2);
}

// A prefill-sized routing (2k rows of K3's top 16 of 896, so every warp places many rounds and
// the counts cross warps) still gives the host's stable grouping.
TEST(MoeGroupEmulationTest, PrefillSizedRoutingMatchesTheHostGrouping) {
  ExpectGroupingMatchesHost(2048, 16, 896, 32, false);
}

// The combine sums each row's slots in row_slots order from 0, skipping -1: compared with the same
// fp32 sums written out here, bit for bit, and rows with no slot are zeros.
TEST(MoeGroupEmulationTest, CombineSumsEachRowsSlotsInItsOrder) {
  const int rows = 5, per_row = 3, slots = 9, width = 300;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> slot_out(slots * width);
  for (float& v : slot_out) v = normal(rng);
  const std::vector<int32_t> row_slots = {4, 0, 8, -1, -1, -1, 2, -1, 7, 1, 3, 5, 6, -1, -1};
  std::vector<float> out(rows * width, NAN);
  simt::RunGrid({rows, 1, 1}, {kMoeCombineThreads, 1, 1}, [&] {
    MoeCombineKernel(slot_out.data(), width, row_slots.data(), per_row, out.data());
  });
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      float want = 0.0f;
      for (int j = 0; j < per_row; ++j) {
        const int32_t slot = row_slots[r * per_row + j];
        if (slot >= 0) want += slot_out[slot * width + c];
      }
      ASSERT_EQ(out[r * width + c], want) << "row " << r << " column " << c;
    }
  }
  EXPECT_EQ(out[1 * width + 17], 0.0f);
}

TEST(MoeGroupEmulationTest, TheChunkBoundHoldsForTheWorstRouting) {
  // Every expert with a group one past a chunk: the most chunks a routing can need.
  const int top_k = 1, experts = 4, chunk_tokens = 8;
  const int rows = experts * (chunk_tokens + 1);
  std::vector<int32_t> ids(rows);
  for (int r = 0; r < rows; ++r) ids[r] = r % experts;
  std::vector<int32_t> table_index = {0, 1, 2, 3};
  const MoeSlots slots = GroupSlotsByExpert(ids, table_index, chunk_tokens);
  EXPECT_LE(static_cast<int32_t>(slots.chunks.size()),
            MoeGroupMaxChunks(rows, top_k, experts, chunk_tokens));
}

TEST(MoeGroupEmulationTest, GatheredRowsAreRoundedLikeTheHost) {
  const int width = 300, rows = 4;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> z(rows * width);
  for (float& v : z) v = normal(rng);
  z[5] = NAN;
  z[6] = std::numeric_limits<float>::infinity();
  z[7] = -0.0f;
  z[8] = 1.0f + 0x1.0p-8f;      // halfway: to even (down)
  z[9] = 1.0f + 3 * 0x1.0p-8f;  // halfway: to even (up)
  z[10] = 0x1.0p-130f;          // subnormal
  const std::vector<int32_t> slot_row = {2, 0, 0, 3, 1};
  std::vector<uint16_t> x(slot_row.size() * width, 0xdead);
  simt::RunGrid({static_cast<int>(slot_row.size()), 1, 1}, {kMoeGroupThreads, 1, 1},
                [&] { MoeGatherRowsKernel(z.data(), width, slot_row.data(), x.data()); });
  for (size_t s = 0; s < slot_row.size(); ++s) {
    for (int c = 0; c < width; ++c) {
      ASSERT_EQ(x[s * width + c], FloatToBf16(z[slot_row[s] * width + c]))
          << "slot " << s << " column " << c;
    }
  }
}

}  // namespace
}  // namespace k3
