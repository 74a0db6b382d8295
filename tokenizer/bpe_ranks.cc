#include "tokenizer/bpe_ranks.h"

#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

// Ranks above this are refused rather than sizing a table by them (the release has 163,584).
constexpr int64_t kMaxRank = 1 << 24;
constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Pieces longer than this merge with a heap (O(n log n)) instead of tiktoken's linear scan per
// merge (O(n^2)): a long whitespace or symbol run, one piece under the split patterns, must not
// stall a server. Both give the same ids.
constexpr size_t kLongPiece = 128;

uint32_t RankOrNone(const absl::flat_hash_map<std::string_view, int32_t>& ranks,
                    std::string_view bytes) {
  auto it = ranks.find(bytes);
  return it == ranks.end() ? kNoRank : static_cast<uint32_t>(it->second);
}

absl::Status LineError(int line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tiktoken.model line ", line, ": ", Sv(what)));
}

}  // namespace

absl::StatusOr<BpeRanks> BpeRanks::Parse(std::string_view text) {
  struct Entry {
    std::string bytes;
    int64_t rank;
  };
  std::vector<Entry> entries;
  int64_t end = 0;
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return LineError(line_number, "expected `<base64 token> <rank>`");
    }
    Entry entry;
    if (!absl::Base64Unescape(Sv(line.substr(0, space)), &entry.bytes)) {
      return LineError(line_number, "bad base64");
    }
    if (entry.bytes.empty()) return LineError(line_number, "empty token");
    if (!absl::SimpleAtoi(Sv(line.substr(space + 1)), &entry.rank) || entry.rank < 0 ||
        entry.rank >= kMaxRank) {
      return LineError(line_number, absl::StrCat("bad rank (must be in 0..", kMaxRank - 1, ")"));
    }
    end = std::max(end, entry.rank + 1);
    entries.push_back(std::move(entry));
  }

  BpeRanks ranks;
  std::string bytes;
  for (const Entry& e : entries) bytes += e.bytes;
  ranks.bytes_ = std::make_unique<const std::string>(std::move(bytes));
  ranks.spans_.resize(end);
  ranks.ranks_.reserve(entries.size());
  uint32_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    Span& span = ranks.spans_[e.rank];
    if (span.length != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tiktoken.model: rank ", e.rank,
                                                     " appears twice"));
    }
    span = {offset, static_cast<uint32_t>(e.bytes.size())};
    const std::string_view key(ranks.bytes_->data() + offset, e.bytes.size());
    if (!ranks.ranks_.emplace(key, static_cast<int32_t>(e.rank)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tiktoken.model: token \"", absl::CHexEscape(Sv(key)),
                       "\" appears twice (ranks ", ranks.ranks_.at(key), " and ", e.rank, ")"));
    }
    offset += e.bytes.size();
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    if (!ranks.ranks_.contains(std::string_view(&byte, 1))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tiktoken.model has no token for the byte 0x%02x", b));
    }
  }
  return ranks;
}

std::optional<int32_t> BpeRanks::Rank(std::string_view bytes) const {
  auto it = ranks_.find(bytes);
  if (it == ranks_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeRanks::Bytes(int32_t rank) const {
  if (rank < 0 || rank >= end()) return {};
  const Span span = spans_[rank];
  return std::string_view(bytes_->data() + span.offset, span.length);
}

void BpeRanks::Encode(std::string_view piece, std::vector<int32_t>* ids) const {
  if (auto whole = ranks_.find(piece); whole != ranks_.end()) {
    ids->push_back(whole->second);
    return;
  }
  if (piece.size() > kLongPiece) {
    MergeLong(piece, ids);
    return;
  }
  // tiktoken's merge loop: parts[k] starts a current token at byte `start`; `rank` is the rank of
  // the token that merging part k with part k+1 would make. Short pieces have few parts, so a
  // linear scan for the minimum beats a heap.
  struct Part {
    uint32_t start;
    uint32_t rank;
  };
  std::vector<Part> parts(piece.size() + 1);
  auto pair_rank = [&](size_t k) {  // parts k and k+1 merged; needs k + 2 < size
    return RankOrNone(ranks_, piece.substr(parts[k].start, parts[k + 2].start - parts[k].start));
  };
  for (size_t k = 0; k <= piece.size(); ++k) parts[k] = {static_cast<uint32_t>(k), kNoRank};
  for (size_t k = 0; k + 2 < parts.size(); ++k) parts[k].rank = pair_rank(k);
  while (parts.size() > 2) {
    size_t best = 0;
    for (size_t k = 1; k + 2 < parts.size(); ++k) {
      if (parts[k].rank < parts[best].rank) best = k;
    }
    if (parts[best].rank == kNoRank) break;
    parts.erase(parts.begin() + best + 1);
    parts[best].rank = best + 2 < parts.size() ? pair_rank(best) : kNoRank;
    if (best > 0) parts[best - 1].rank = pair_rank(best - 1);
  }
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    ids->push_back(ranks_.at(piece.substr(parts[k].start, parts[k + 1].start - parts[k].start)));
  }
}

// The same merges as the loop above in O(n log n): a doubly linked list of parts and a min-heap
// of (rank, start) for the pairs, so the pair taken is again the lowest rank, leftmost on ties.
// Heap entries go stale when a neighbor merges; one is used only if it still describes its part.
void BpeRanks::MergeLong(std::string_view piece, std::vector<int32_t>* ids) const {
  const uint32_t n = static_cast<uint32_t>(piece.size());
  // Part i starts at byte i while alive; next[i] is the start of the part after it (n at the end).
  std::vector<uint32_t> next(n), prev(n), rank(n);
  std::vector<bool> alive(n, true);
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;  // wraps for i == 0, never read there
  }
  auto pair_rank = [&](uint32_t i) {
    if (next[i] >= n) return kNoRank;
    return RankOrNone(ranks_, piece.substr(i, next[next[i]] - i));
  };
  using Entry = std::pair<uint32_t, uint32_t>;  // (rank, start)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t i = 0; i < n; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.push({rank[i], i});
  }
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || rank[i] != r) continue;
    const uint32_t gone = next[i];
    alive[gone] = false;
    next[i] = next[gone];
    if (next[i] < n) prev[next[i]] = i;
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.push({rank[i], i});
    if (i > 0) {
      const uint32_t p = prev[i];
      rank[p] = pair_rank(p);
      if (rank[p] != kNoRank) heap.push({rank[p], p});
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) ids->push_back(ranks_.at(piece.substr(i, next[i] - i)));
}

}  // namespace k3
