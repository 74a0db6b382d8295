#include "kernels/cuda/moe_grouping.h"

#include <algorithm>
#include <numeric>

namespace k3 {

int32_t MoeChunkTokensFor(int64_t largest) { return largest <= 8 ? 8 : largest <= 16 ? 16 : 32; }

MoeSlots GroupSlotsByExpert(const std::vector<int32_t>& experts,
                            const std::vector<int32_t>& table_index, int32_t chunk_tokens) {
  MoeSlots slots;
  slots.order.resize(experts.size());
  std::iota(slots.order.begin(), slots.order.end(), 0);
  std::stable_sort(slots.order.begin(), slots.order.end(),
                   [&](int32_t a, int32_t b) { return experts[a] < experts[b]; });
  const size_t n = slots.order.size();
  if (chunk_tokens == 0) {
    int64_t largest = 0;
    for (size_t begin = 0; begin < n;) {
      size_t end = begin;
      while (end < n && experts[slots.order[end]] == experts[slots.order[begin]]) ++end;
      largest = std::max(largest, static_cast<int64_t>(end - begin));
      begin = end;
    }
    chunk_tokens = MoeChunkTokensFor(largest);
  }
  slots.chunk_tokens = chunk_tokens;
  for (size_t slot = 0; slot < n; ++slot) {
    const int32_t expert = table_index[experts[slots.order[slot]]];
    if (slots.chunks.empty() || slots.chunks.back().expert != expert ||
        slots.chunks.back().tokens == chunk_tokens) {
      slots.chunks.push_back(MoeChunk{expert, static_cast<int32_t>(slot), 0});
    }
    ++slots.chunks.back().tokens;
  }
  return slots;
}

}  // namespace k3
