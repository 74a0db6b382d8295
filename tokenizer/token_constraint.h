// Constrained decoding at the token level: which ids may come next so that the answer follows a
// given shape, e.g. K3's `<|open|>response<|sep|>` + a JSON value of a schema + `<|close|>...`,
// or one of several tool calls. A shape is a list of alternatives, each a sequence of pieces:
// a special token, a literal text, a JSON value (JsonGrammar), or free text up to a token (a
// think section). The alternatives are followed in parallel until the ids tell them apart.
//
// Free text holds no special token but its own (so an answer cannot end, or start another
// section, inside it) and at most `max_free_tokens` tokens, after which its token is the only
// one allowed. With a token limit, every id allowed leaves room for the shortest rest of the
// shape (counted in bytes: every byte is a token of a byte-level BPE vocabulary, which
// TokenVocabulary::has_byte_tokens says), so a shape that fits the limit at the start always
// ends within it: the free text closes, strings close, objects get their required members.
//
// TokenVocabulary and the alternatives are immutable and shared; a TokenConstraint is the state
// of one generation (not thread-safe).
#ifndef K3SERVE_TOKENIZER_TOKEN_CONSTRAINT_H_
#define K3SERVE_TOKENIZER_TOKEN_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/json_grammar.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

// Every id's bytes (a special token's: none) and whether it is special.
class TokenVocabulary {
 public:
  explicit TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab_size);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool special(int32_t id) const { return special_[id]; }
  // Whether each of the 256 bytes is a text token of its own.
  bool has_byte_tokens() const { return has_byte_tokens_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  bool has_byte_tokens_ = false;
};

struct ConstraintPiece {
  enum class Kind { kToken, kText, kJson, kFreeUntil };
  Kind kind;
  int32_t token = -1;  // kToken: this id; kFreeUntil: text tokens up to and including this id
  std::string text;    // kText (never empty)
  std::shared_ptr<const JsonGrammar> json;  // kJson: must be followed by a kToken piece
  int max_free_tokens = -1;  // kFreeUntil: the most text tokens before `token`; -1: no limit
};
using ConstraintShape = std::vector<std::vector<ConstraintPiece>>;  // alternatives

// The fewest tokens a whole answer of `alternative` takes, with a vocabulary of byte tokens
// (free text: none but its closing token).
int MinTokens(const std::vector<ConstraintPiece>& alternative);

class TokenConstraint {
 public:
  // `max_tokens` > 0: the answer, from its first id, has at most that many ids (the shape's
  // last token included); 0: no limit.
  TokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                  std::shared_ptr<const ConstraintShape> shape, int max_tokens = 0);

  // allowed[id] for every id of the vocabulary that may come next; false when none may (a
  // shape that has ended, or no alternative left).
  bool Allowed(std::vector<char>* allowed) const;
  // Moves past `id`; alternatives that do not allow it are dropped.
  void Advance(int32_t id);

 private:
  struct Position {
    int alternative;
    size_t piece = 0;
    size_t offset = 0;                  // kText: bytes read; kFreeUntil: tokens read
    std::optional<JsonMatcher> json;    // kJson: where reading stands
  };
  const ConstraintPiece* Piece(const Position& p) const;
  // The position after `id`, or nullopt.
  std::optional<Position> After(const Position& p, int32_t id) const;
  void Enter(Position& p) const;  // starts the piece p points at
  // The fewest tokens from `p` to the end of its alternative; INT_MAX where it cannot end.
  int MinTokensFrom(const Position& p) const;
  // Whether the rest from `p` fits in the tokens left after one more.
  bool Fits(const Position& p) const;

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::shared_ptr<const ConstraintShape> shape_;
  const int max_tokens_;
  int used_ = 0;  // ids advanced past
  // rest_[a][i]: the fewest tokens of alternative a's pieces from i on.
  std::vector<std::vector<int>> rest_;
  std::vector<Position> positions_;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_TOKEN_CONSTRAINT_H_
