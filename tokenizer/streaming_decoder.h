// Detokenization while tokens arrive one at a time (streamed answers).
#ifndef K3SERVE_TOKENIZER_STREAMING_DECODER_H_
#define K3SERVE_TOKENIZER_STREAMING_DECODER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

// U+FFFD in UTF-8: what bytes that form no character become.
inline constexpr char kReplacementCharacter[] = "\xef\xbf\xbd";

// Turns a stream of ids into a stream of valid UTF-8 text. A token may end inside a character
// (byte-level BPE splits rare characters, emoji and random models' output anywhere); those bytes
// are held back until the character completes, so no chunk ever carries half a character.
// Bytes that can never form a character (a stray continuation byte, an invalid lead byte, a
// sequence cut short by the next character) come out as U+FFFD, one per maximal invalid
// subsequence (the WHATWG / Unicode "maximal subpart" practice), so the output is always valid.
// For ids forming valid UTF-8, the concatenated chunks equal Tokenizer::Decode of all the ids.
//
// Holds a reference to the tokenizer, which must outlive it. Not thread-safe: one per stream.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // The text that `id` completes (possibly empty). An unknown id is InvalidArgument and leaves
  // the decoder as it was.
  absl::StatusOr<std::string> Push(int32_t id);

  // The end of the stream: an incomplete character still held back becomes U+FFFD.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;  // bytes of a character not yet complete (at most 3)
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_STREAMING_DECODER_H_
