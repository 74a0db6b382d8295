// The small tokenizer that random checkpoints ship with, so that text round-trips through models
// whose vocabulary is far smaller than the release's (512 ids for k3-tiny).
#ifndef K3SERVE_TOKENIZER_RANDOM_TOKENIZER_H_
#define K3SERVE_TOKENIZER_RANDOM_TOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

// Which names the special tokens get (spec §4); the chat format follows from them.
enum class TokenizerFamily { kK3, kKimi };

// The contents of tiktoken.model and tokenizer_config.json.
struct TokenizerFiles {
  std::string tiktoken_model;
  std::string config_json;
};

// The top kSmallSpecialBlock ids hold the special tokens: the release's 256-id block with its
// unnamed middle cut out, so offsets 0..17 keep their places ([BOS] first, the turn end third)
// and [UNK], [PAD] are the last two ids.
inline constexpr int kSmallSpecialBlock = 32;
inline constexpr int64_t kSmallestTokenizerVocab = 256 + kSmallSpecialBlock;

// A tokenizer with exactly `vocab_size` ids: the 256 single bytes (ids 0..255); then tokens learned
// by byte-pair training on a built-in multilingual text (English, Chinese, code, numbers) until
// the ids below the special block are used up or the text has no pair left; then special tokens,
// with any ids between the last learned token and the top block reserved
// ("<|reserved_token_{id}|>"). A pure function of its arguments. vocab_size below
// kSmallestTokenizerVocab is InvalidArgument.
absl::StatusOr<TokenizerFiles> RandomTokenizerFiles(int64_t vocab_size, TokenizerFamily family);

// The tokenizer of RandomTokenizerFiles(vocab_size, family), built in memory.
absl::StatusOr<Tokenizer> RandomTokenizer(int64_t vocab_size, TokenizerFamily family);

// Writes DIR/tiktoken.model and DIR/tokenizer_config.json (DIR must exist).
absl::Status WriteRandomTokenizer(const std::string& dir, int64_t vocab_size,
                                  TokenizerFamily family);

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_RANDOM_TOKENIZER_H_
