#include "tokenizer/text_prompt.h"

#include "base/status_macros.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/streaming_decoder.h"

namespace k3 {

absl::StatusOr<EncodedPrompt> EncodePrompt(const Tokenizer& tokenizer, std::string_view text,
                                           const PromptOptions& options) {
  EncodedPrompt prompt;
  if (!options.chat) {
    K3_ASSIGN_OR_RETURN(prompt.ids, tokenizer.Encode(text));
    return prompt;
  }
  const ChatMessage message{"user", std::string(text), ""};
  K3_ASSIGN_OR_RETURN(prompt.ids, RenderChat(tokenizer, {message}, {.thinking = options.thinking}));
  K3_ASSIGN_OR_RETURN(prompt.stop_id, TurnEndId(tokenizer));
  return prompt;
}

absl::StatusOr<std::string> DecodeForDisplay(const Tokenizer& tokenizer,
                                             absl::Span<const int32_t> ids) {
  StreamingDecoder decoder(tokenizer);
  std::string text;
  for (int32_t id : ids) {
    K3_ASSIGN_OR_RETURN(const std::string chunk, decoder.Push(id));
    text += chunk;
  }
  return text + decoder.Finish();
}

}  // namespace k3
