// The base tokens of a tiktoken.model and rank-ordered byte-pair merging over them (spec §3).
#ifndef K3SERVE_TOKENIZER_BPE_RANKS_H_
#define K3SERVE_TOKENIZER_BPE_RANKS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace k3 {

// Token bytes <-> rank; the rank is the token id. Immutable after Parse, so every method is
// thread-safe. Ranks may have gaps (no bytes for them) but each byte string has one rank, and every
// single byte is a token, so any byte string can be encoded.
class BpeRanks {
 public:
  // Parses tiktoken.model text: one `<base64 bytes> <rank>` per line (blank lines ignored).
  // A malformed line, bad base64, an empty token, a duplicate token or rank, or a missing single
  // byte is InvalidArgument naming the line.
  static absl::StatusOr<BpeRanks> Parse(std::string_view text);

  // Appends the ids of `piece` (any bytes): the piece itself when it is a token, else its single
  // bytes merged repeatedly at the adjacent pair whose concatenation has the lowest rank (the
  // leftmost on ties) until no adjacent pair is a token, as tiktoken does.
  void Encode(std::string_view piece, std::vector<int32_t>* ids) const;

  // The rank of exactly these bytes, if they are a token.
  std::optional<int32_t> Rank(std::string_view bytes) const;

  // The bytes of token `rank`; empty when no token has that rank (a gap, or past the end).
  std::string_view Bytes(int32_t rank) const;

  // One past the highest rank.
  int32_t end() const { return static_cast<int32_t>(spans_.size()); }

 private:
  struct Span {
    uint32_t offset = 0;
    uint32_t length = 0;  // 0: no token has this rank
  };

  BpeRanks() = default;

  // Encode's merging for long pieces, in O(n log n).
  void MergeLong(std::string_view piece, std::vector<int32_t>* ids) const;

  // Every token's bytes, concatenated; behind a pointer so that moving a BpeRanks keeps the
  // buffer that ranks_'s keys view.
  std::unique_ptr<const std::string> bytes_;
  std::vector<Span> spans_;  // by rank, into *bytes_
  absl::flat_hash_map<std::string_view, int32_t> ranks_;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_BPE_RANKS_H_
