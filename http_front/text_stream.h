// TextStream: one choice's generation as the OpenAI API shows it. It reads the choice's gRPC
// Generate stream and turns the tokens into text pieces: decoding (never half a character),
// dropping the stop tokens (eos, the chat's turn end) and, with skip_special_tokens, every other
// special token too; cutting at stop strings (which cancels the call, freeing the worker's
// state); and, when asked, each token's log-probabilities with the alternatives' texts. Chat
// answers go through ChatOutputParser, fed the token ids (special tokens by name, whatever
// skip_special_tokens says: they are the answer's structure) into reasoning, content and tool
// calls; stop strings are matched on the content.
//
// Thread-compatible: one per choice, used from the thread that serves the request.
#ifndef K3SERVE_HTTP_FRONT_TEXT_STREAM_H_
#define K3SERVE_HTTP_FRONT_TEXT_STREAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "http_front/openai_protocol.h"
#include "http_front/stop_matcher.h"
#include "http_front/worker_pool.h"
#include "tokenizer/chat_output_parser.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

struct TextStreamOptions {
  std::vector<int32_t> stop_ids;  // end the answer and add nothing to it
  std::vector<std::string> stops;  // stop strings
  bool skip_special_tokens = true;
  // Chat: parse the answer (ChatOutputParser) in this format; the prompt opened a think section
  // when `thinking`; calls get ids `call_id_prefix` + their index.
  std::optional<ChatFormat> chat_format;
  bool thinking = false;
  std::string call_id_prefix;
};

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, TextStreamOptions options);

  // Reads the next message of `call`; false once the generation ended (then finish_reason() is
  // set, or Error() says why not). Appends the text it releases to piece->text (chat: the
  // content, and piece->reasoning, piece->tool_calls) and, when
  // piece->logprobs is set, the log-probabilities of the tokens read (the worker sends them
  // when the request's top_logprobs is set).
  bool Next(GenerateCall& call, Choice* piece);

  // Why the stream ended without a finish reason.
  absl::Status Error(GenerateCall& call);

  const std::string& finish_reason() const { return finish_reason_; }
  int generated() const { return generated_; }

 private:
  bool Silent(int32_t id) const;
  std::string TokenText(int32_t id) const;
  // Decoded text: through the chat parser if any, then the content through the stop strings.
  void Release(const std::string& text, Choice* piece);

  const Tokenizer& tokenizer_;
  StreamingDecoder decoder_;
  const TextStreamOptions options_;
  StopMatcher matcher_;
  std::optional<ChatOutputParser> chat_;
  std::string finish_reason_;  // empty until the generation ended normally
  absl::Status error_;
  int generated_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_TEXT_STREAM_H_
