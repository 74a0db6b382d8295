#include "http_front/prefix_affinity.h"

#include "absl/hash/hash.h"
#include "glog/logging.h"

namespace k3 {

PrefixAffinity::PrefixAffinity(int64_t block_tokens, size_t capacity)
    : block_tokens_(block_tokens), capacity_(capacity) {
  CHECK_GT(block_tokens, 0);
  CHECK_GT(capacity, 0u);
}

std::vector<uint64_t> PrefixAffinity::PrefixHashes(absl::Span<const int32_t> tokens) const {
  std::vector<uint64_t> hashes;
  uint64_t chain = 0;
  for (size_t end = block_tokens_; end <= tokens.size(); end += block_tokens_) {
    chain = absl::HashOf(chain, tokens.subspan(end - block_tokens_, block_tokens_));
    hashes.push_back(chain);
  }
  return hashes;
}

std::optional<std::pair<int, int64_t>> PrefixAffinity::Lookup(
    absl::Span<const int32_t> tokens) const {
  const std::vector<uint64_t> hashes = PrefixHashes(tokens);
  absl::MutexLock lock(&mu_);
  for (size_t i = hashes.size(); i > 0; --i) {
    auto it = index_.find(hashes[i - 1]);
    if (it != index_.end()) {
      return std::make_pair(it->second->second, static_cast<int64_t>(i) * block_tokens_);
    }
  }
  return std::nullopt;
}

void PrefixAffinity::Record(absl::Span<const int32_t> tokens, int worker) {
  const std::vector<uint64_t> hashes = PrefixHashes(tokens);
  absl::MutexLock lock(&mu_);
  for (uint64_t hash : hashes) {
    auto it = index_.find(hash);
    if (it != index_.end()) {
      it->second->second = worker;
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.emplace_front(hash, worker);
    index_[hash] = lru_.begin();
    if (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
}

void PrefixAffinity::Forget(int worker) {
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->second != worker) {
      ++it;
      continue;
    }
    index_.erase(it->first);
    it = lru_.erase(it);
  }
}

size_t PrefixAffinity::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace k3
