// Text in and out for one-shot generation (`k3serve generate --prompt "text"`): the prompt's ids,
// the id to stop at, and the answer as displayable text.
//
//   auto tokenizer = Tokenizer::Load(model_dir);
//   auto prompt = EncodePrompt(*tokenizer, "Why is the sky blue?", {.chat = true});
//   options.stop_token_ids.push_back(*prompt->stop_id);     // chat: the turn end
//   auto generated = engine->Generate(prompt->ids, options);
//   std::cout << *DecodeForDisplay(*tokenizer, *generated) << "\n";
#ifndef K3SERVE_TOKENIZER_TEXT_PROMPT_H_
#define K3SERVE_TOKENIZER_TEXT_PROMPT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

struct PromptOptions {
  // Render the text as one user message in the model's chat format and open the assistant's
  // answer; otherwise encode it as plain text to be continued.
  bool chat = false;
  bool thinking = true;  // chat with K3: the answer opens with a think block
};

struct EncodedPrompt {
  std::vector<int32_t> ids;
  std::optional<int32_t> stop_id;  // chat: the turn end (<|end_of_msg|> / <|im_end|>)
};

// Invalid UTF-8 is InvalidArgument; chat with a tokenizer without chat tokens is
// FailedPrecondition.
absl::StatusOr<EncodedPrompt> EncodePrompt(const Tokenizer& tokenizer, std::string_view text,
                                           const PromptOptions& options);

// The text of generated ids for a person to read: always valid UTF-8 (see StreamingDecoder for
// how bytes that form no character show), special tokens by name. An unknown id is
// InvalidArgument.
absl::StatusOr<std::string> DecodeForDisplay(const Tokenizer& tokenizer,
                                             absl::Span<const int32_t> ids);

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_TEXT_PROMPT_H_
