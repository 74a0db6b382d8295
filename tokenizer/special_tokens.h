// The named special tokens of K3 and of Kimi K2 / Kimi Linear (spec §4), which share ids.
#ifndef K3SERVE_TOKENIZER_SPECIAL_TOKENS_H_
#define K3SERVE_TOKENIZER_SPECIAL_TOKENS_H_

namespace k3 {

// A special token's place in the block of 256 special ids after the base tokens (the release's
// block starts at 163584) and its name in each family; nullptr where a family has none there.
struct SpecialTokenSlot {
  int offset;
  const char* k3_name;
  const char* kimi_name;
};

inline constexpr int kSpecialBlockSize = 256;

inline constexpr SpecialTokenSlot kSpecialTokenSlots[] = {
    {0, "[BOS]", "[BOS]"},
    {1, "[EOS]", "[EOS]"},
    {2, "<|end_of_msg|>", "<|im_end|>"},  // the end of a chat turn (eos_token_id)
    {3, "<|open|>", "<|im_user|>"},
    {4, "<|close|>", "<|im_assistant|>"},
    {5, "<|sep|>", nullptr},
    {9, "[EOT]", "[EOT]"},
    {10, nullptr, "<|im_system|>"},
    {11, nullptr, "<|tool_calls_section_begin|>"},  // Kimi K2's tool calls (reserved on K3)
    {12, nullptr, "<|tool_calls_section_end|>"},
    {13, nullptr, "<|tool_call_begin|>"},
    {14, nullptr, "<|tool_call_argument_begin|>"},
    {15, nullptr, "<|tool_call_end|>"},
    {17, nullptr, "<|im_middle|>"},
    {254, "[UNK]", "[UNK]"},
    {255, "[PAD]", "[PAD]"},
};

// K3 chat format ("XTML") tokens.
inline constexpr char kK3Open[] = "<|open|>";
inline constexpr char kK3Close[] = "<|close|>";
inline constexpr char kK3Sep[] = "<|sep|>";
inline constexpr char kK3EndOfMessage[] = "<|end_of_msg|>";

// Kimi K2 / Kimi Linear chat format tokens.
inline constexpr char kKimiSystem[] = "<|im_system|>";
inline constexpr char kKimiUser[] = "<|im_user|>";
inline constexpr char kKimiAssistant[] = "<|im_assistant|>";
inline constexpr char kKimiMiddle[] = "<|im_middle|>";
inline constexpr char kKimiEnd[] = "<|im_end|>";
inline constexpr char kKimiToolCallsBegin[] = "<|tool_calls_section_begin|>";
inline constexpr char kKimiToolCallsEnd[] = "<|tool_calls_section_end|>";
inline constexpr char kKimiToolCallBegin[] = "<|tool_call_begin|>";
inline constexpr char kKimiToolCallArgumentBegin[] = "<|tool_call_argument_begin|>";
inline constexpr char kKimiToolCallEnd[] = "<|tool_call_end|>";

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_SPECIAL_TOKENS_H_
