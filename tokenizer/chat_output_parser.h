// The model's answer in OpenAI's shape: the thinking section as reasoning, the response as
// content, and tool calls with JSON arguments (spec K3-TOKENIZER.md §4). K3 writes
//   <|open|>think<|sep|>..<|close|>think<|sep|><|open|>response<|sep|>..<|close|>response<|sep|>
//   <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
//     <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>...   (or one
//     <|open|>json type="object"<|sep|>JSON<|close|>json<|sep|>)
//   <|close|>call<|sep|>...<|close|>tools<|sep|><|close|>message<|sep|>
// and Kimi K2 writes content, then <|tool_calls_section_begin|>, per call <|tool_call_begin|>
// functions.NAME:I<|tool_call_argument_begin|>JSON<|tool_call_end|>, <|tool_calls_section_end|>.
//
// Fed the generated tokens as they come (special tokens by name, the text between them), it
// returns deltas, so that a stream can send reasoning, content and each call's arguments as they
// are generated. Structure comes only from special tokens: text that looks like a tag is text.
// Not thread-safe: one per generation.
#ifndef K3SERVE_TOKENIZER_CHAT_OUTPUT_PARSER_H_
#define K3SERVE_TOKENIZER_CHAT_OUTPUT_PARSER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "tokenizer/chat_template.h"

namespace k3 {

// A piece of a tool call: the first piece of call `index` has its id and name; arguments
// pieces concatenate to the call's JSON arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  // Appends `next`, merging the pieces of one call (a whole answer is the sum of its deltas).
  void Append(const ChatDelta& next);
};

class ChatOutputParser {
 public:
  // `thinking`: the prompt opened K3's think section (the generation prompt with thinking on),
  // so the answer starts as reasoning. Calls get ids `call_id_prefix` + their index.
  ChatOutputParser(ChatFormat format, bool thinking, std::string call_id_prefix);

  // A special token's name (e.g. "<|sep|>"), and the text generated between special tokens.
  void Special(std::string_view name, ChatDelta* delta);
  void Text(std::string_view text, ChatDelta* delta);

  // The generation ended here. A K3 call whose own close tag did not come but whose arguments
  // did is closed (its arguments are then whole: no call is dropped for a missing end marker);
  // an answer cut inside a call's arguments (or its header) is FAILED_PRECONDITION naming the
  // call, whose arguments in the deltas are then a prefix. OK otherwise.
  absl::Status Finish(ChatDelta* delta);

  // Whether the answer has ended (K3's </message> or end of turn, Kimi's <|im_end|>).
  bool done() const { return mode_ == Mode::kDone; }
  int tool_call_count() const { return calls_; }

 private:
  enum class Mode { kReasoning, kContent, kBetween, kCallHeader, kCall, kArgument, kJson, kDone };

  void K3Special(std::string_view name, ChatDelta* delta);
  void KimiSpecial(std::string_view name, ChatDelta* delta);
  void K3Open(std::string_view header, ChatDelta* delta);
  void K3Close(std::string_view tag, ChatDelta* delta);
  ToolCallDelta& StartCall(std::string name, std::string id, ChatDelta* delta);
  ToolCallDelta& Arguments(ChatDelta* delta);

  const ChatFormat format_;
  const std::string call_id_prefix_;
  Mode mode_;
  enum class Tag { kNone, kOpen, kClose } tag_ = Tag::kNone;  // K3: reading a tag's header
  std::string header_;        // the tag (K3) or call id (Kimi) being read
  int calls_ = 0;             // calls started
  bool string_value_ = false;  // K3: the argument being read is a string (JSON-escaped)
  int arguments_ = 0;         // K3: typed arguments of the current call so far
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_CHAT_OUTPUT_PARSER_H_
