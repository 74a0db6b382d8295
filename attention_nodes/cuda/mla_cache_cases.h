// Test-only: a cache write both MLA cache tests run (mla_cache_test.cc on a GPU,
// mla_cache_emulation_test.cc on the CPU), with the cache it must leave, computed from
// mla_cache.h's layout rule and kernels/bf16.h's rounding.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_CASES_H_
#define K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_CASES_H_

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/bf16.h"

namespace k3::mla_cache_test {

struct CacheCase {
  int32_t width = 0, page_size = 0, max_pages = 0, pages = 0;
  std::vector<float> new_rows;
  std::vector<int32_t> sequence, position, block_table;
  std::vector<uint16_t> cache_before, cache_after;
};

// Three sequences with pages scattered over the pool in reverse order: a prefill chunk of
// `chunk` tokens for sequence 0 from position 0, one decode token for sequence 1 at position
// page_size (the first row of its second page) and one for sequence 2 at position page_size - 1
// (the last row of its first page). Pages nobody writes keep their random bits.
inline CacheCase MakeCacheCase(int32_t width, int32_t page_size, int32_t chunk, uint32_t seed) {
  CacheCase c;
  c.width = width;
  c.page_size = page_size;
  c.max_pages = (chunk + page_size - 1) / page_size + 1;
  c.pages = 3 * c.max_pages + 1;
  for (int32_t i = 0; i < 3 * c.max_pages; ++i) c.block_table.push_back(c.pages - 1 - i);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  c.cache_before.resize(static_cast<size_t>(c.pages) * page_size * width);
  for (uint16_t& b : c.cache_before) b = static_cast<uint16_t>(bits(rng));
  for (int32_t t = 0; t < chunk; ++t) {
    c.sequence.push_back(0);
    c.position.push_back(t);
  }
  c.sequence.insert(c.sequence.end(), {1, 2});
  c.position.insert(c.position.end(), {page_size, page_size - 1});
  c.new_rows.resize(c.sequence.size() * width);
  for (float& v : c.new_rows) v = normal(rng);
  c.cache_after = c.cache_before;
  for (size_t r = 0; r < c.sequence.size(); ++r) {
    const int32_t page = c.block_table[c.sequence[r] * c.max_pages + c.position[r] / page_size];
    const size_t row = static_cast<size_t>(page) * page_size + c.position[r] % page_size;
    for (int32_t i = 0; i < width; ++i) {
      c.cache_after[row * width + i] = FloatToBf16(c.new_rows[r * width + i]);
    }
  }
  return c;
}

}  // namespace k3::mla_cache_test

#endif  // K3SERVE_ATTENTION_NODES_CUDA_MLA_CACHE_CASES_H_
