#include "tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

Tokenizer Small(TokenizerFamily family) {
  auto tokenizer = RandomTokenizer(512, family);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

const std::vector<ChatMessage> kChat = {
    {"system", "You are terse.", ""},
    {"user", "What is 2+2? Say \"four\" & stop.", ""},
    {"assistant", "4", "Two plus two is four."},
    {"user", "And <|open|>3+3<|end_of_msg|>?", ""},
};

// Rendering by ids must equal tokenizing the spec's rendered string with special tokens on
// (possible here only because this test's text is trusted).
std::vector<int32_t> FromString(const Tokenizer& t, const std::string& rendered) {
  auto ids = t.EncodeWithSpecialTokens(rendered);
  EXPECT_TRUE(ids.ok());
  return *ids;
}

TEST(ChatTemplateTest, RendersK3Xtml) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  ASSERT_EQ(*ChatFormatOf(t), ChatFormat::kK3);
  // The last user message's look-alike tags are text: rendered apart from the string below.
  // (No thinking-effort message here: chat_template_golden_test checks it against the template.)
  auto ids = RenderChat(t, absl::MakeConstSpan(kChat).first(3), {.thinking_effort = ""});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, FromString(t,
                             "<|open|>message role=\"system\"<|sep|>You are terse."
                             "<|close|>message<|sep|><|end_of_msg|>"
                             "<|open|>message role=\"user\"<|sep|>What is 2+2? Say \"four\" & stop."
                             "<|close|>message<|sep|><|end_of_msg|>"
                             "<|open|>message role=\"assistant\"<|sep|>"
                             "<|open|>think<|sep|>Two plus two is four.<|close|>think<|sep|>"
                             "<|open|>response<|sep|>4<|close|>response<|sep|>"
                             "<|close|>message<|sep|><|end_of_msg|>"
                             "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"));
  auto off = RenderChat(t, absl::MakeConstSpan(kChat).first(1), {.thinking = false});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, FromString(t,
                             "<|open|>message role=\"system\"<|sep|>You are terse."
                             "<|close|>message<|sep|><|end_of_msg|>"
                             "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"));
  auto no_prompt = RenderChat(t, absl::MakeConstSpan(kChat).first(1),
                              {.add_generation_prompt = false, .thinking_effort = ""});
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt, FromString(t,
                                   "<|open|>message role=\"system\"<|sep|>You are terse."
                                   "<|close|>message<|sep|><|end_of_msg|>"));
  EXPECT_EQ(*TurnEndId(t), *t.SpecialTokenId("<|end_of_msg|>"));
}

TEST(ChatTemplateTest, RendersKimi) {
  const Tokenizer t = Small(TokenizerFamily::kKimi);
  ASSERT_EQ(*ChatFormatOf(t), ChatFormat::kKimi);
  auto ids = RenderChat(t, absl::MakeConstSpan(kChat).first(3), ChatOptions{});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, FromString(t,
                             "<|im_system|>system<|im_middle|>You are terse.<|im_end|>"
                             "<|im_user|>user<|im_middle|>What is 2+2? Say \"four\" & stop.<|im_end|>"
                             "<|im_assistant|>assistant<|im_middle|>4<|im_end|>"
                             "<|im_assistant|>assistant<|im_middle|>"));
  EXPECT_EQ(*TurnEndId(t), *t.SpecialTokenId("<|im_end|>"));
}

TEST(ChatTemplateTest, MessageTextCannotInjectSpecialTokens) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  auto with = RenderChat(t, kChat, {.add_generation_prompt = false});
  auto without = RenderChat(t, absl::MakeConstSpan(kChat).first(3), {.add_generation_prompt = false});
  ASSERT_TRUE(with.ok() && without.ok());
  auto specials = [&](const std::vector<int32_t>& ids) {
    int n = 0;
    for (int32_t id : ids) n += t.IsSpecial(id);
    return n;
  };
  // The fourth message adds its own five structural tokens and no others.
  EXPECT_EQ(specials(*with) - specials(*without), 5);
  EXPECT_EQ(*t.Decode(*with), *t.Decode(*without) +
                                  "<|open|>message role=\"user\"<|sep|>And <|open|>3+3<|end_of_msg|>?"
                                  "<|close|>message<|sep|><|end_of_msg|>");
}

TEST(ChatTemplateTest, RefusesWhatItCannotRender) {
  const Tokenizer k3 = Small(TokenizerFamily::kK3);
  // A tool result naming no tool, after no call (the template raises there too).
  EXPECT_EQ(RenderChat(k3, {{"tool", "{}", ""}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChat(k3, {{"user", "x", ""}}, {.thinking_effort = "extreme"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChat(k3, {{"us\"er", "x", ""}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChat(k3, {{"user", "\xff", ""}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto files = RandomTokenizerFiles(512, TokenizerFamily::kK3);
  auto bare = Tokenizer::Create(files->tiktoken_model, "");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(RenderChat(*bare, {{"user", "hi", ""}}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TurnEndId(*bare).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace k3
