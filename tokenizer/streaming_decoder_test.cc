#include "tokenizer/streaming_decoder.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

Tokenizer Small() {
  auto tokenizer = RandomTokenizer(512, TokenizerFamily::kK3);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

std::string DecodeBytes(const Tokenizer& t, const std::string& bytes) {
  StreamingDecoder decoder(t);
  std::string text;
  for (char c : bytes) text += *decoder.Push(static_cast<uint8_t>(c));  // ids 0..255 are bytes
  return text + decoder.Finish();
}

// Multi-byte characters the small vocabulary splits into byte tokens: every chunk must end on a
// character boundary of the text and the chunks must add up to the text.
TEST(StreamingDecoderTest, ChunksEndOnCharacterBoundaries) {
  const Tokenizer t = Small();
  const std::string text = "héllo 🙂🚀 世界 Ωμέγα\n";
  auto ids = t.Encode(text);
  ASSERT_TRUE(ids.ok());
  StreamingDecoder decoder(t);
  std::string joined;
  int held_back = 0;
  for (int32_t id : *ids) {
    auto chunk = decoder.Push(id);
    ASSERT_TRUE(chunk.ok());
    if (chunk->empty()) ++held_back;
    joined += *chunk;
    ASSERT_EQ(text.compare(0, joined.size(), joined), 0);
    if (joined.size() < text.size()) {
      EXPECT_NE(static_cast<uint8_t>(text[joined.size()]) & 0xc0, 0x80) << joined;
    }
  }
  EXPECT_EQ(decoder.Finish(), "");
  EXPECT_EQ(joined, text);
  EXPECT_GT(held_back, 0);  // the emoji really were split across tokens
}

// Expected outputs follow the "maximal subpart" rule (as WHATWG's TextDecoder does).
TEST(StreamingDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer t = Small();
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(DecodeBytes(t, "a\xff" "b"), "a" + r + "b");
  EXPECT_EQ(DecodeBytes(t, "\x80x"), r + "x");
  EXPECT_EQ(DecodeBytes(t, "\xe4\xb8z"), r + "z");          // a cut 3-byte sequence: one U+FFFD
  EXPECT_EQ(DecodeBytes(t, "\xed\xa0\x80"), r + r + r);     // a surrogate
  EXPECT_EQ(DecodeBytes(t, "\xc0\xaf"), r + r);             // an overlong form
  EXPECT_EQ(DecodeBytes(t, "\xf4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(DecodeBytes(t, "ok\xf0\x9f\x99"), "ok" + r);    // cut off by the end of the stream
  EXPECT_EQ(DecodeBytes(t, "\xf0\x9f\x99\x82"), "🙂");
}

TEST(StreamingDecoderTest, UnknownIdLeavesTheStreamAsItWas) {
  const Tokenizer t = Small();
  StreamingDecoder decoder(t);
  EXPECT_EQ(*decoder.Push(0xe4), "");
  EXPECT_EQ(decoder.Push(1 << 20).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*decoder.Push(0xb8), "");
  EXPECT_EQ(*decoder.Push(0xad), "中");
  EXPECT_EQ(*decoder.Push(*t.SpecialTokenId("<|open|>")), "<|open|>");
}

}  // namespace
}  // namespace k3
