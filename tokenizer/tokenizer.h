// The K3 / Kimi tokenizer: tiktoken.model ranks, the release's split pattern and the special tokens
// of tokenizer_config.json (spec §1-§4).
//
// Text is encoded with special tokens off: user text containing "<|open|>" is ordinary text, so
// users cannot inject chat structure; chat rendering inserts special tokens by id. Decoding
// concatenates token bytes (special tokens as their names); ids may split a UTF-8 character, see
// StreamingDecoder for emitting text while tokens arrive.
#ifndef K3SERVE_TOKENIZER_TOKENIZER_H_
#define K3SERVE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tokenizer/bpe_ranks.h"
#include "tokenizer/pretokenizer.h"

namespace k3 {

struct SpecialToken {
  int32_t id;
  std::string name;
};

// The ids tokenizer_config.json names as bos/eos/pad/unk; unset when it names none.
struct NamedTokenIds {
  std::optional<int32_t> bos, eos, pad, unk;
};

// Immutable after construction; every method is thread-safe. Copyable (shares nothing mutable).
class Tokenizer {
 public:
  static constexpr char kRanksFile[] = "tiktoken.model";
  static constexpr char kConfigFile[] = "tokenizer_config.json";

  // Loads DIR/tiktoken.model and DIR/tokenizer_config.json with the K3 split pattern.
  static absl::StatusOr<Tokenizer> Load(const std::string& dir);

  // From file contents. `config_json` may be empty (no special tokens); `pattern` replaces the
  // K3 split pattern (other encodings, e.g. cl100k_base, in tests).
  static absl::StatusOr<Tokenizer> Create(std::string_view tiktoken_model,
                                          std::string_view config_json,
                                          std::string_view pattern = kK3Pattern);

  // Ids of `text` with special-token names treated as ordinary text. Invalid UTF-8 is
  // InvalidArgument.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  // As Encode, but every special token's name in `text` becomes that token's id (leftmost first,
  // the longest name where several start at one place). For trusted text only.
  absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view text) const;

  // The concatenated bytes of `ids`: base tokens' bytes, special tokens' names. May end inside a
  // UTF-8 character (or hold invalid UTF-8 if the ids are arbitrary). An unknown id is
  // InvalidArgument.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;
  // Appends one token's bytes to `out`.
  absl::Status AppendTokenBytes(int32_t id, std::string* out) const;

  // The id of a special token by name ("<|open|>"), or nullopt.
  std::optional<int32_t> SpecialTokenId(std::string_view name) const;
  // True for special token ids (named or reserved).
  bool IsSpecial(int32_t id) const;

  const NamedTokenIds& named_ids() const { return named_ids_; }
  // One past the highest id a file names (base or special).
  int32_t vocab_size() const { return vocab_size_; }

 private:
  Tokenizer(BpeRanks ranks, Pretokenizer pretokenizer)
      : ranks_(std::make_shared<const BpeRanks>(std::move(ranks))),
        pretokenizer_(std::move(pretokenizer)) {}

  absl::Status EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const;
  // The special token whose name starts `text` (the longest), if any.
  const SpecialToken* SpecialAt(std::string_view text) const;

  std::shared_ptr<const BpeRanks> ranks_;
  Pretokenizer pretokenizer_;
  absl::flat_hash_map<int32_t, std::string> special_names_;
  absl::flat_hash_map<std::string, int32_t> special_ids_;
  // Special tokens by the first byte of their name, longest name first (EncodeWithSpecialTokens).
  absl::flat_hash_map<char, std::vector<SpecialToken>> specials_by_first_byte_;
  NamedTokenIds named_ids_;
  int32_t vocab_size_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_TOKENIZER_H_
