// Constrained decoding at the token level: which ids may come next so that the answer follows a
// given shape, e.g. K3's `<|open|>response<|sep|>` + a JSON value of a schema + `<|close|>...`,
// or one of several tool calls. A shape is a list of alternatives, each a sequence of pieces:
// a special token, a literal text, a JSON value (JsonGrammar), or free text up to a token (a
// think section). The alternatives are followed in parallel until the ids tell them apart.
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

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
};

struct ConstraintPiece {
  enum class Kind { kToken, kText, kJson, kFreeUntil };
  Kind kind;
  int32_t token = -1;  // kToken: this id; kFreeUntil: anything up to and including this id
  std::string text;    // kText (never empty)
  std::shared_ptr<const JsonGrammar> json;  // kJson: must be followed by a kToken piece
};
using ConstraintShape = std::vector<std::vector<ConstraintPiece>>;  // alternatives

class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                  std::shared_ptr<const ConstraintShape> shape);

  // allowed[id] for every id of the vocabulary that may come next; false when none may (a
  // shape that has ended, or no alternative left).
  bool Allowed(std::vector<char>* allowed) const;
  // Moves past `id`; alternatives that do not allow it are dropped.
  void Advance(int32_t id);

 private:
  struct Position {
    int alternative;
    size_t piece = 0;
    size_t offset = 0;                  // kText: bytes read
    std::optional<JsonMatcher> json;    // kJson: where reading stands
  };
  const ConstraintPiece* Piece(const Position& p) const;
  bool AcceptsSpecial(const Position& p, int32_t id) const;
  // The position after `id`, or nullopt.
  std::optional<Position> After(const Position& p, int32_t id) const;
  void Enter(Position& p) const;  // starts the piece p points at

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::shared_ptr<const ConstraintShape> shape_;
  std::vector<Position> positions_;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_TOKEN_CONSTRAINT_H_
