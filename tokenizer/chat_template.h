// Chat rendering to token ids (spec §4): K3's "XTML" format or the Kimi K2 / Kimi Linear format,
// chosen by the special tokens the model's tokenizer has. Special tokens go in by id, text by
// Tokenizer::Encode, so message text can never produce a special token.
#ifndef K3SERVE_TOKENIZER_CHAT_TEMPLATE_H_
#define K3SERVE_TOKENIZER_CHAT_TEMPLATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

enum class ChatFormat { kK3, kKimi };

struct ChatMessage {
  std::string role;       // "system", "user" or "assistant" (tool messages are not rendered yet)
  std::string content;
  std::string reasoning;  // an assistant's thinking; K3 renders it as a think block, Kimi drops it
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the opening of an assistant message
  bool thinking = true;               // K3: the prompt opens a think block, else the response
};

// K3 when the tokenizer has <|open|>, <|close|>, <|sep|> and <|end_of_msg|>; Kimi when it has
// <|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|> and <|im_end|>; else
// FailedPrecondition.
absl::StatusOr<ChatFormat> ChatFormatOf(const Tokenizer& tokenizer);

// The id that ends a chat turn (<|end_of_msg|> or <|im_end|>): where generation stops.
absl::StatusOr<int32_t> TurnEndId(const Tokenizer& tokenizer);

// The ids of `messages` in the tokenizer's chat format, without BOS. An unknown role is
// InvalidArgument; a tool message is Unimplemented; invalid UTF-8 text is InvalidArgument.
absl::StatusOr<std::vector<int32_t>> RenderChat(const Tokenizer& tokenizer,
                                                absl::Span<const ChatMessage> messages,
                                                const ChatOptions& options);

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_CHAT_TEMPLATE_H_
