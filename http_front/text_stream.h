// TextStream: one choice's generation as the OpenAI API shows it. It reads the choice's gRPC
// Generate stream and turns the tokens into text pieces: decoding (never half a character),
// dropping the stop tokens (eos, the chat's turn end) and, with skip_special_tokens, every other
// special token too; cutting at stop strings (which cancels the call, freeing the worker's
// state); and, when asked, each token's log-probabilities with the alternatives' texts.
//
// Thread-compatible: one per choice, used from the thread that serves the request.
#ifndef K3SERVE_HTTP_FRONT_TEXT_STREAM_H_
#define K3SERVE_HTTP_FRONT_TEXT_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "http_front/openai_protocol.h"
#include "http_front/stop_matcher.h"
#include "http_front/worker_pool.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

struct TextStreamOptions {
  std::vector<int32_t> stop_ids;  // end the answer and add nothing to it
  std::vector<std::string> stops;  // stop strings
  bool skip_special_tokens = true;
};

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, TextStreamOptions options);

  // Reads the next message of `call`; false once the generation ended (then finish_reason() is
  // set, or Error() says why not). Appends the text it releases to piece->text and, when
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

  const Tokenizer& tokenizer_;
  StreamingDecoder decoder_;
  const TextStreamOptions options_;
  StopMatcher matcher_;
  std::string finish_reason_;  // empty until the generation ended normally
  absl::Status error_;
  int generated_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_TEXT_STREAM_H_
