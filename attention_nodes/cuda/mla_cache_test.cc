// LaunchMlaCacheWrite (mla_cache.cu) on a GPU: a prefill chunk and two decode tokens written into
// a paged bf16 cache (mla_cache_cases.h) must leave exactly the cache that mla_cache.h's layout
// rule and kernels/bf16.h's rounding give, every other page untouched, at K3's width (576) and
// k3-tiny's. Without a GPU the GPU cases report themselves skipped ("no GPU").
#include "attention_nodes/cuda/mla_cache.h"

#include <vector>

#include "attention_nodes/cuda/mla_cache_cases.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gpu_test_util.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;

void ExpectWrites(int32_t width, int32_t page_size, int32_t chunk, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "width " << width << " page " << page_size);
  const mla_cache_test::CacheCase c = mla_cache_test::MakeCacheCase(width, page_size, chunk, seed);
  DeviceArray<float> rows(c.new_rows);
  DeviceArray<int32_t> sequence(c.sequence), position(c.position), table(c.block_table);
  DeviceArray<uint16_t> cache(c.cache_before);
  MlaCacheWrite write;
  write.rows = static_cast<int32_t>(c.sequence.size());
  write.width = width;
  write.page_size = page_size;
  write.max_pages = c.max_pages;
  write.new_rows = rows.get();
  write.sequence = sequence.get();
  write.position = position.get();
  write.block_table = table.get();
  write.cache = cache.get();
  ASSERT_EQ(LaunchMlaCacheWrite(write, nullptr), 0);
  gpu_test::ExpectDeviceOk();
  EXPECT_EQ(cache.Download(), c.cache_after);
}

TEST(MlaCacheGpuTest, WritesRowsWhereDecodeReadsThem) {
  REQUIRE_GPU();
  ExpectWrites(576, 64, 150, 1);
  ExpectWrites(80, 16, 37, 2);
}

TEST(MlaCacheGpuTest, RefusesBadShapes) {
  MlaCacheWrite write;
  write.rows = 1;
  write.width = 576;
  write.max_pages = 1;
  write.page_size = 0;
  EXPECT_NE(LaunchMlaCacheWrite(write, nullptr), 0);
  write.page_size = 64;
  write.rows = 0;
  EXPECT_NE(LaunchMlaCacheWrite(write, nullptr), 0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
