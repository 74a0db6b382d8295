#include "tokenizer/random_tokenizer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

// The vocabularies of the tiny configs (spec K3-MODEL.md §12: 512) and of k3-perf (4096).
class RandomTokenizerTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(RandomTokenizerTest, FitsTheVocabularyWithSpecialTokensOnTop) {
  const int64_t vocab = GetParam();
  for (TokenizerFamily family : {TokenizerFamily::kK3, TokenizerFamily::kKimi}) {
    auto files = RandomTokenizerFiles(vocab, family);
    ASSERT_TRUE(files.ok()) << files.status();
    auto t = Tokenizer::Create(files->tiktoken_model, files->config_json);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->vocab_size(), vocab);
    const int64_t top = vocab - kSmallSpecialBlock;
    for (const SpecialTokenSlot& slot : kSpecialTokenSlots) {
      const char* name = family == TokenizerFamily::kK3 ? slot.k3_name : slot.kimi_name;
      if (name == nullptr) continue;
      const int64_t expected = slot.offset < kSmallSpecialBlock
                                   ? top + slot.offset
                                   : vocab - (kSpecialBlockSize - slot.offset);
      EXPECT_EQ(t->SpecialTokenId(name), expected) << name;
    }
    for (int64_t id = 0; id < vocab; ++id) EXPECT_TRUE(t->Decode({static_cast<int32_t>(id)}).ok());
  }
}

TEST_P(RandomTokenizerTest, LearnedTokensShortenTextAndRoundTrip) {
  auto files = RandomTokenizerFiles(GetParam(), TokenizerFamily::kK3);
  ASSERT_TRUE(files.ok());
  auto t = Tokenizer::Create(files->tiktoken_model, files->config_json);
  ASSERT_TRUE(t.ok());
  const std::string text = "The model reads the text and writes the answer. 今天天气很好。";
  auto ids = t->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_LT(ids->size() * 2, text.size());
  EXPECT_EQ(*t->Decode(*ids), text);
  for (int32_t id : *ids) EXPECT_LT(id, GetParam() - kSmallSpecialBlock);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, RandomTokenizerTest, ::testing::Values(512, 4096));

TEST(RandomTokenizerTest, IsAPureFunctionOfItsArguments) {
  auto a = RandomTokenizerFiles(700, TokenizerFamily::kK3);
  auto b = RandomTokenizerFiles(700, TokenizerFamily::kK3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tiktoken_model, b->tiktoken_model);
  EXPECT_EQ(a->config_json, b->config_json);
}

TEST(RandomTokenizerTest, RefusesVocabulariesWithoutRoomForBytesAndSpecials) {
  EXPECT_EQ(RandomTokenizerFiles(287, TokenizerFamily::kK3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RandomTokenizerFiles(288, TokenizerFamily::kK3).ok());
}

}  // namespace
}  // namespace k3
