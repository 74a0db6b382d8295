#include "tokenizer/token_constraint.h"

#include <algorithm>
#include <climits>
#include <string_view>
#include <utility>

namespace k3 {

using Kind = ConstraintPiece::Kind;

namespace {

int PieceMinTokens(const ConstraintPiece& piece) {
  switch (piece.kind) {
    case Kind::kToken:
    case Kind::kFreeUntil:
      return 1;
    case Kind::kText:
      return static_cast<int>(piece.text.size());
    case Kind::kJson:
      return piece.json->MinBytes();
  }
  return 0;
}

}  // namespace

int MinTokens(const std::vector<ConstraintPiece>& alternative) {
  int tokens = 0;
  for (const ConstraintPiece& piece : alternative) tokens += PieceMinTokens(piece);
  return tokens;
}

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab_size)
    : bytes_(vocab_size), special_(vocab_size) {
  std::vector<bool> byte_seen(256);
  for (int64_t id = 0; id < vocab_size; ++id) {
    special_[id] = tokenizer.IsSpecial(static_cast<int32_t>(id));
    if (!special_[id] && !tokenizer.AppendTokenBytes(static_cast<int32_t>(id), &bytes_[id]).ok()) {
      special_[id] = true;  // not a text token (padding of the embedding): never text
    }
    if (!special_[id] && bytes_[id].size() == 1) byte_seen[static_cast<uint8_t>(bytes_[id][0])] = true;
  }
  has_byte_tokens_ = std::find(byte_seen.begin(), byte_seen.end(), false) == byte_seen.end();
}

TokenConstraint::TokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                                 std::shared_ptr<const ConstraintShape> shape, int max_tokens)
    : vocabulary_(std::move(vocabulary)), shape_(std::move(shape)), max_tokens_(max_tokens) {
  for (size_t a = 0; a < shape_->size(); ++a) {
    const std::vector<ConstraintPiece>& pieces = (*shape_)[a];
    std::vector<int>& rest = rest_.emplace_back(pieces.size() + 1, 0);
    for (size_t i = pieces.size(); i-- > 0;) rest[i] = rest[i + 1] + PieceMinTokens(pieces[i]);
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

int TokenConstraint::MinTokensFrom(const Position& p) const {
  const ConstraintPiece* piece = Piece(p);
  if (piece == nullptr) return 0;
  int here = 0;
  switch (piece->kind) {
    case Kind::kToken:
    case Kind::kFreeUntil:
      here = 1;
      break;
    case Kind::kText:
      here = static_cast<int>(piece->text.size() - p.offset);
      break;
    case Kind::kJson:
      here = p.json->MinBytesToEnd();
      if (here < 0) return INT_MAX;
      break;
  }
  return here + rest_[p.alternative][p.piece + 1];
}

bool TokenConstraint::Fits(const Position& p) const {
  return max_tokens_ <= 0 || MinTokensFrom(p) <= max_tokens_ - used_ - 1;
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
        return next;
      }
      // No other special token: the free text cannot end the answer or open a section.
      if (special) return std::nullopt;
      if (piece->max_free_tokens >= 0 && p.offset >= static_cast<size_t>(piece->max_free_tokens)) {
        return std::nullopt;
      }
      ++next.offset;
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
      // Every text token leads to the same position, so one check decides them all.
      Position text = p;
      ++text.offset;
      const bool more = (piece->max_free_tokens < 0 ||
                         p.offset < static_cast<size_t>(piece->max_free_tokens)) &&
                        Fits(text);
      if (more) {
        for (int64_t id = 0; id < vocab; ++id) {
          if (!vocabulary_->special(id)) (*allowed)[id] = 1;
        }
        any = true;
      }
      if (piece->token >= 0 && piece->token < vocab) {
        const std::optional<Position> closed = After(p, piece->token);
        if (closed.has_value() && Fits(*closed)) {
          (*allowed)[piece->token] = 1;
          any = true;
        }
      }
      continue;
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
      std::optional<Position> after = After(p, static_cast<int32_t>(id));
      if (after.has_value() && Fits(*after)) {
        (*allowed)[id] = 1;
        any = true;
      }
    }
  }
  return any;
}

void TokenConstraint::Advance(int32_t id) {
  std::vector<Position> next;
  ++used_;
  for (const Position& p : positions_) {
    if (id < 0 || id >= vocabulary_->size()) break;
    std::optional<Position> after = After(p, id);
    if (after.has_value()) next.push_back(*std::move(after));
  }
  positions_ = std::move(next);
}

}  // namespace k3
