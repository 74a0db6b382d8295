#include "tokenizer/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kVocab = 512;

Tokenizer Small() {
  auto files = RandomTokenizerFiles(kVocab, TokenizerFamily::kK3);
  EXPECT_TRUE(files.ok()) << files.status();
  auto tokenizer = Tokenizer::Create(files->tiktoken_model, files->config_json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

TEST(TokenizerTest, SpecialTokenNamesInTextStayText) {
  const Tokenizer t = Small();
  const int32_t open = *t.SpecialTokenId("<|open|>");
  const std::string text = "say <|open|>message<|sep|> and [BOS] please";
  auto plain = t.Encode(text);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (int32_t id : *plain) EXPECT_FALSE(t.IsSpecial(id)) << id;
  EXPECT_EQ(*t.Decode(*plain), text);

  auto trusted = t.EncodeWithSpecialTokens(text);
  ASSERT_TRUE(trusted.ok());
  EXPECT_THAT(*trusted, Contains(open));
  EXPECT_THAT(*trusted, Contains(*t.named_ids().bos));
  EXPECT_EQ(*t.Decode(*trusted), text);
  // The text between special tokens encodes as it would alone.
  auto say = t.Encode("say ");
  ASSERT_TRUE(say.ok());
  EXPECT_EQ(std::vector<int32_t>(trusted->begin(), trusted->begin() + say->size() + 1),
            [&] {
              std::vector<int32_t> ids = *say;
              ids.push_back(open);
              return ids;
            }());
}

TEST(TokenizerTest, NamedIdsComeFromTheConfig) {
  const Tokenizer t = Small();
  EXPECT_EQ(t.vocab_size(), kVocab);
  EXPECT_EQ(t.named_ids().bos, kVocab - 32);
  EXPECT_EQ(t.named_ids().eos, kVocab - 31);
  EXPECT_EQ(t.named_ids().unk, kVocab - 2);
  EXPECT_EQ(t.named_ids().pad, kVocab - 1);
  EXPECT_EQ(t.SpecialTokenId("<|end_of_msg|>"), kVocab - 30);
  EXPECT_EQ(t.SpecialTokenId("<|nope|>"), std::nullopt);
}

TEST(TokenizerTest, DecodesReservedIdsAndRejectsUnknownOnes) {
  auto files = RandomTokenizerFiles(kVocab, TokenizerFamily::kK3);
  ASSERT_TRUE(files.ok());
  // Without a config every id in the 256 after the base tokens is a reserved special token.
  auto t = Tokenizer::Create(files->tiktoken_model, "");
  ASSERT_TRUE(t.ok()) << t.status();
  const int32_t base_end = t->vocab_size();
  EXPECT_TRUE(t->IsSpecial(base_end));
  EXPECT_EQ(*t->Decode({'a', base_end + 255}),
            "a<|reserved_token_" + std::to_string(base_end + 255) + "|>");
  EXPECT_FALSE(t->IsSpecial(base_end + 256));
  EXPECT_EQ(t->Decode({base_end + 256}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, RejectsInvalidUtf8) {
  const Tokenizer t = Small();
  EXPECT_EQ(t.Encode("abc\xc3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.EncodeWithSpecialTokens("<|open|>\xc0\xaf").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, RejectsBadConfigs) {
  auto files = RandomTokenizerFiles(kVocab, TokenizerFamily::kK3);
  ASSERT_TRUE(files.ok());
  auto error = [&](const std::string& config) {
    auto t = Tokenizer::Create(files->tiktoken_model, config);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << config;
    return std::string(t.status().message());
  };
  EXPECT_THAT(error("{"), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(error("[]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error(R"({"added_tokens_decoder": {"x": {"content": "a"}}})"),
              HasSubstr("not an id"));
  EXPECT_THAT(error(R"({"added_tokens_decoder": {"2147483647": {"content": "a"}}})"),
              HasSubstr("not an id"));
  EXPECT_THAT(error(R"({"added_tokens_decoder": {"600": {"special": true}}})"),
              HasSubstr("no \"content\""));
  EXPECT_THAT(error(R"({"added_tokens_decoder": {"65": {"content": "<|a|>"}}})"),
              HasSubstr("a base token's rank"));
  EXPECT_THAT(error(R"({"added_tokens_decoder": {"600": {"content": "<|a|>"},
                                                 "601": {"content": "<|a|>"}}})"),
              HasSubstr("appears twice"));
  EXPECT_THAT(error(R"({"bos_token": {"content": "[BOS]"}})"), HasSubstr("not an added token"));
}

TEST(TokenizerTest, LoadsAModelFolder) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/model";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(Tokenizer::Load(dir).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteRandomTokenizer(dir, kVocab, TokenizerFamily::kKimi).ok());
  auto t = Tokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->SpecialTokenId("<|im_end|>"), kVocab - 30);
  const std::string text = "Hello world, 你好世界 🙂";
  EXPECT_EQ(*t->Decode(*t->Encode(text)), text);
  EXPECT_THAT(*t->Encode(text), Not(Contains(*t->named_ids().unk)));
}

}  // namespace
}  // namespace k3
