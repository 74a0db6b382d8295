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
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace k3 {

enum class ChatFormat { kK3, kKimi };

// A call an assistant message made (OpenAI's tool_calls[].function).
struct ChatToolCall {
  std::string id;
  std::string name;
  // As the client sent it: a JSON object's text renders as K3's typed arguments (what the model
  // writes), anything else as K3's json block, as the template does with a string.
  std::string arguments;
};

struct ChatMessage {
  std::string role;       // "system", "user", "assistant" or "tool"
  std::string content;
  std::string reasoning;  // an assistant's thinking; K3 renders it as a think block, Kimi drops it
  std::string name;       // optional: a name attribute (K3) or the role's name (Kimi)
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call this is the result of
};

// The template's variables besides the messages (spec §4; the release's template is the
// reference: //tokenizer:chat_template_golden_test compares against it).
struct ChatOptions {
  bool add_generation_prompt = true;  // end with the opening of an assistant message
  bool thinking = true;               // K3: the prompt opens a think block, else the response
  // K3 with thinking: "low", "medium", "high" or "max", rendered as a thinking-effort system
  // message; empty renders none.
  std::string thinking_effort = "max";
  nlohmann::ordered_json tools;  // OpenAI's `tools` array, or null
  std::string tool_choice;       // K3 renders "none" and "required" as a system message
  // K3: "json_object" or "json_schema" (with its schema) rendered as a system message.
  std::string response_format;
  nlohmann::ordered_json response_schema;
};

// K3 when the tokenizer has <|open|>, <|close|>, <|sep|> and <|end_of_msg|>; Kimi when it has
// <|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|> and <|im_end|>; else
// FailedPrecondition.
absl::StatusOr<ChatFormat> ChatFormatOf(const Tokenizer& tokenizer);

// The id that ends a chat turn (<|end_of_msg|> or <|im_end|>): where generation stops.
absl::StatusOr<int32_t> TurnEndId(const Tokenizer& tokenizer);

// The ids of `messages` in the tokenizer's chat format, without BOS: the ids of the release's
// chat template's text, special tokens by id and each text between two of them encoded whole.
// An unknown role, an unknown thinking effort, a tool result whose tool cannot be told, or
// invalid UTF-8 text is InvalidArgument.
absl::StatusOr<std::vector<int32_t>> RenderChat(const Tokenizer& tokenizer,
                                                absl::Span<const ChatMessage> messages,
                                                const ChatOptions& options);

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_CHAT_TEMPLATE_H_
