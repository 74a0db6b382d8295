#include "tokenizer/text_prompt.h"

#include "gtest/gtest.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

Tokenizer Small(TokenizerFamily family) {
  auto tokenizer = RandomTokenizer(512, family);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

TEST(TextPromptTest, PlainTextIsEncodedAsIs) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  auto prompt = EncodePrompt(t, "The capital of France is", {});
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->ids, *t.Encode("The capital of France is"));
  EXPECT_EQ(prompt->stop_id, std::nullopt);
  EXPECT_EQ(EncodePrompt(t, "\xff", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TextPromptTest, ChatIsOneUserTurnAndStopsAtTheTurnEnd) {
  for (TokenizerFamily family : {TokenizerFamily::kK3, TokenizerFamily::kKimi}) {
    const Tokenizer t = Small(family);
    for (bool thinking : {true, false}) {
      auto prompt = EncodePrompt(t, "Hi!", {.chat = true, .thinking = thinking});
      ASSERT_TRUE(prompt.ok()) << prompt.status();
      EXPECT_EQ(prompt->ids, *RenderChat(t, {{"user", "Hi!", ""}}, {.thinking = thinking}));
      EXPECT_EQ(prompt->stop_id, *TurnEndId(t));
    }
  }
}

TEST(TextPromptTest, DisplayTextIsValidUtf8) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  std::vector<int32_t> ids = *t.Encode("ok 🙂");
  EXPECT_EQ(*DecodeForDisplay(t, ids), "ok 🙂");
  ids.pop_back();  // the emoji cut short: its first bytes show as one U+FFFD
  EXPECT_EQ(*DecodeForDisplay(t, ids), "ok \xef\xbf\xbd");
  EXPECT_EQ(DecodeForDisplay(t, {1 << 20}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
