// The pre-tokenizer: splits text into the pieces that byte-pair encoding then merges one at a time
// (spec §2). A piece never spans two matches of the pattern, so BPE never merges across them.
#ifndef K3SERVE_TOKENIZER_PRETOKENIZER_H_
#define K3SERVE_TOKENIZER_PRETOKENIZER_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {

// The K3 / Kimi release's pattern in the form PCRE2 accepts: the release writes its letter classes
// as set intersections ([\p{Lu}...\p{M}&&[^\p{Han}]]), which PCRE2 lacks, so each becomes a
// per-character negative lookahead for Han over the plain class. Same language, same order.
extern const char kK3Pattern[];

// A compiled split pattern (PCRE2, UTF + UCP, JIT-compiled when the platform allows).
// Immutable after Create; Split is thread-safe (each call has its own match data).
class Pretokenizer {
 public:
  // Compiles `pattern`; a pattern PCRE2 rejects is InvalidArgument with PCRE2's message.
  static absl::StatusOr<Pretokenizer> Create(std::string_view pattern);

  // The successive leftmost matches of the pattern in `text`, as views into `text`. Like the
  // release, the text is first cut every 400,000 characters and inside runs of more than 25,000
  // whitespace or non-whitespace characters, and each part is matched alone. Text the pattern
  // skips (none for the K3 pattern, whose last branches match any whitespace and whose others
  // cover every other character) is not returned. Invalid UTF-8 is InvalidArgument.
  absl::StatusOr<std::vector<std::string_view>> Split(std::string_view text) const;

  // Calls `piece` for each match, in order, without collecting them.
  absl::Status ForEachPiece(std::string_view text,
                            const std::function<void(std::string_view)>& piece) const;

 private:
  struct Code;
  explicit Pretokenizer(std::shared_ptr<const Code> code) : code_(std::move(code)) {}

  // ForEachPiece on one part of the release's cut, which starts `offset` bytes into the text.
  absl::Status MatchPieces(std::string_view text, size_t offset,
                           const std::function<void(std::string_view)>& piece) const;

  std::shared_ptr<const Code> code_;  // shared by copies; immutable
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_PRETOKENIZER_H_
