#include "attention_nodes/scheduler/step_packer.h"

#include <algorithm>

namespace k3 {

int64_t StepPack::prefill_tokens() const {
  int64_t tokens = 0;
  for (const PrefillChunk& chunk : prefill) tokens += chunk.tokens;
  return tokens;
}

namespace {

// Grants prompt tokens to the prefilling sequences out of one budget.
class PromptGrants {
 public:
  PromptGrants(absl::Span<const PackInput> running, std::vector<size_t> prefilling,
               int64_t budget, int64_t granule, int64_t chunk)
      : running_(running),
        prefilling_(std::move(prefilling)),
        give_(prefilling_.size(), 0),
        budget_(budget),
        granule_(granule),
        chunk_(chunk) {}

  size_t size() const { return prefilling_.size(); }
  int64_t budget() const { return budget_; }
  int64_t left(size_t i) const {
    const PackInput& s = running_[prefilling_[i]];
    return s.prompt_tokens - s.consumed - give_[i];
  }

  // Gives prompt i up to `most` more tokens; a chunk that stops short of the prompt's end is cut
  // back to a granule boundary into the prompt when that keeps at least one of its tokens, else
  // (with a `chunk`) back to a chunk boundary, else on to the next one.
  void Grant(size_t i, int64_t most) {
    int64_t tokens = std::min({budget_, left(i), most});
    if (tokens <= 0) return;
    if (tokens < left(i)) {
      const int64_t start = running_[prefilling_[i]].consumed + give_[i];
      const int64_t aligned = (start + tokens) / granule_ * granule_ - start;
      if (aligned > 0) {
        tokens = aligned;
      } else if (chunk_ > 0) {
        const int64_t down = (start + tokens) / chunk_ * chunk_ - start;
        tokens = down > 0 ? down : std::min(left(i), (start / chunk_ + 1) * chunk_ - start);
      }
    }
    give_[i] += tokens;
    budget_ -= tokens;
  }

  std::vector<PrefillChunk> Chunks() const {
    std::vector<PrefillChunk> chunks;
    for (size_t i = 0; i < prefilling_.size(); ++i) {
      if (give_[i] == 0) continue;
      chunks.push_back({prefilling_[i], give_[i], left(i) == 0});
    }
    return chunks;
  }

 private:
  absl::Span<const PackInput> running_;
  const std::vector<size_t> prefilling_;
  std::vector<int64_t> give_;
  int64_t budget_;
  const int64_t granule_;
  const int64_t chunk_;
};

}  // namespace

StepPack StepPacker::Pack(absl::Span<const PackInput> running, const PackLimits& limits) {
  const int64_t max_tokens = std::max<int64_t>(limits.max_tokens, 1);
  std::vector<size_t> decoders, prefilling;
  for (size_t i = 0; i < running.size(); ++i) {
    (running[i].decoding() ? decoders : prefilling).push_back(i);
  }
  StepPack pack;
  if (!decoders.empty()) {
    const int64_t floor =
        prefilling.empty() ? 0 : std::clamp<int64_t>(limits.prompt_floor, 0, max_tokens - 1);
    const size_t count = decoders.size();
    const size_t take =
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(count), max_tokens - floor));
    const size_t start = decode_cursor_ % count;
    for (size_t i = 0; i < take; ++i) pack.decode.push_back(decoders[(start + i) % count]);
    std::sort(pack.decode.begin(), pack.decode.end());
    decode_cursor_ = (start + take) % count;
  }
  const int64_t budget =
      std::clamp<int64_t>(limits.prompt_budget, 0, max_tokens - pack.decode_tokens());
  PromptGrants grants(running, std::move(prefilling), budget,
                      std::max<int64_t>(limits.granule, 1), std::max<int64_t>(limits.chunk, 0));
  if (grants.size() == 0 || budget == 0) return pack;
  grants.Grant(0, std::max<int64_t>(1, budget / 2));
  std::vector<size_t> order;
  for (size_t i = 1; i < grants.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return grants.left(a) < grants.left(b); });
  for (size_t i : order) {
    if (grants.left(i) <= grants.budget()) grants.Grant(i, grants.left(i));
  }
  for (size_t i = 0; i < grants.size(); ++i) grants.Grant(i, grants.budget());
  pack.prefill = grants.Chunks();
  return pack;
}

}  // namespace k3
