// mla_cache.h's device code (mla_cache_kernel.inc) run on the CPU under simt_emulation.h, on every
// machine: the cache it leaves must equal the one mla_cache_cases.h computes from the layout rule.
#include "kernels/cuda/simt_emulation.h"
// After the emulation, which defines what the device code uses of CUDA.
#include <cstdint>

#include "attention_nodes/cuda/mla_cache.h"
#include "attention_nodes/cuda/mla_cache_kernel.inc"

#include <vector>

#include "attention_nodes/cuda/mla_cache_cases.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(MlaCacheEmulationTest, WritesRowsWhereDecodeReadsThem) {
  for (const auto& [width, page_size, chunk] : {std::tuple{576, 64, 70}, std::tuple{80, 16, 37}}) {
    SCOPED_TRACE(testing::Message() << "width " << width);
    mla_cache_test::CacheCase c = mla_cache_test::MakeCacheCase(width, page_size, chunk, 3);
    MlaCacheWrite write;
    write.rows = static_cast<int32_t>(c.sequence.size());
    write.width = width;
    write.page_size = page_size;
    write.max_pages = c.max_pages;
    write.new_rows = c.new_rows.data();
    write.sequence = c.sequence.data();
    write.position = c.position.data();
    write.block_table = c.block_table.data();
    std::vector<uint16_t> cache = c.cache_before;
    write.cache = cache.data();
    simt::RunGrid({write.rows, 1, 1}, {kMlaCacheThreads, 1, 1},
                  [&] { MlaCacheWriteKernel(write); });
    EXPECT_EQ(cache, c.cache_after);
  }
}

}  // namespace
}  // namespace k3
