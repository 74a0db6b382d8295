#include "tokenizer/token_constraint.h"

#include <string_view>
#include <utility>

namespace k3 {

using Kind = ConstraintPiece::Kind;

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab_size)
    : bytes_(vocab_size), special_(vocab_size) {
  for (int64_t id = 0; id < vocab_size; ++id) {
    special_[id] = tokenizer.IsSpecial(static_cast<int32_t>(id));
    if (!special_[id] && !tokenizer.AppendTokenBytes(static_cast<int32_t>(id), &bytes_[id]).ok()) {
      special_[id] = true;  // not a text token (padding of the embedding): never text
    }
  }
}

TokenConstraint::TokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                                 std::shared_ptr<const ConstraintShape> shape)
    : vocabulary_(std::move(vocabulary)), shape_(std::move(shape)) {
  for (size_t a = 0; a < shape_->size(); ++a) {
    Position p{.alternative = static_cast<int>(a)};
    Enter(p);
    positions_.push_back(std::move(p));
  }
}

const ConstraintPiece* TokenConstraint::Piece(const Position& p) const {
  const std::vector<ConstraintPiece>& pieces = (*shape_)[p.alternative];
  return p.piece < pieces.size() ? &pieces[p.piece] : nullptr;
}

void TokenConstraint::Enter(Position& p) const {
  p.offset = 0;
  p.json.reset();
  const ConstraintPiece* piece = Piece(p);
  if (piece != nullptr && piece->kind == Kind::kJson) p.json.emplace(piece->json);
}

std::optional<TokenConstraint::Position> TokenConstraint::After(const Position& p,
                                                                int32_t id) const {
  const ConstraintPiece* piece = Piece(p);
  if (piece == nullptr) return std::nullopt;
  Position next = p;
  const bool special = vocabulary_->special(id);
  const std::string& bytes = vocabulary_->bytes(id);
  switch (piece->kind) {
    case Kind::kFreeUntil:
      if (id == piece->token) {
        ++next.piece;
        Enter(next);
      }
      return next;
    case Kind::kToken:
      if (id != piece->token) return std::nullopt;
      ++next.piece;
      Enter(next);
      return next;
    case Kind::kText:
      if (special || bytes.empty() ||
          std::string_view(piece->text).substr(p.offset, bytes.size()) != bytes) {
        return std::nullopt;
      }
      next.offset += bytes.size();
      if (next.offset == piece->text.size()) {
        ++next.piece;
        Enter(next);
      }
      return next;
    case Kind::kJson:
      if (special) {
        // The value must be whole, and the token the piece after it.
        if (!p.json->CanEnd()) return std::nullopt;
        ++next.piece;
        Enter(next);
        return After(next, id);
      }
      if (bytes.empty() || !next.json->Feed(bytes)) return std::nullopt;
      return next;
  }
  return std::nullopt;
}

bool TokenConstraint::Allowed(std::vector<char>* allowed) const {
  const int64_t vocab = vocabulary_->size();
  allowed->assign(vocab, 0);
  bool any = false;
  for (const Position& p : positions_) {
    const ConstraintPiece* piece = Piece(p);
    if (piece == nullptr) continue;
    if (piece->kind == Kind::kFreeUntil) {
      allowed->assign(vocab, 1);
      return true;
    }
    // A JSON value first checks each possible first byte once: most ids fail there.
    std::vector<char> first_byte(256, 1);
    if (piece->kind == Kind::kJson) {
      for (int b = 0; b < 256; ++b) {
        JsonMatcher tried = *p.json;
        const char c = static_cast<char>(b);
        first_byte[b] = tried.Feed(std::string_view(&c, 1));
      }
    }
    for (int64_t id = 0; id < vocab; ++id) {
      if ((*allowed)[id]) continue;
      const std::string& bytes = vocabulary_->bytes(id);
      if (!vocabulary_->special(id) && !bytes.empty() &&
          !first_byte[static_cast<uint8_t>(bytes[0])]) {
        continue;
      }
      if (After(p, static_cast<int32_t>(id)).has_value()) {
        (*allowed)[id] = 1;
        any = true;
      }
    }
  }
  return any;
}

void TokenConstraint::Advance(int32_t id) {
  std::vector<Position> next;
  for (const Position& p : positions_) {
    if (id < 0 || id >= vocabulary_->size()) break;
    std::optional<Position> after = After(p, id);
    if (after.has_value()) next.push_back(*std::move(after));
  }
  positions_ = std::move(next);
}

}  // namespace k3
