#include "tools/random_model_folder.h"

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "tokenizer/random_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

class WriteRandomModelFolderTest : public ::testing::Test {
 protected:
  // An empty folder of this test's own.
  static std::string Folder() {
    const std::filesystem::path folder =
        std::filesystem::path(::testing::TempDir()) /
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(folder);
    return folder.string();
  }

  static ModelConfig Named(std::string_view name) {
    absl::StatusOr<ModelConfig> config = NamedConfig(name);
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? *std::move(config) : ModelConfig();
  }
};

// The tokenizer written beside the weights fits the vocabulary and carries the family's names.
TEST_F(WriteRandomModelFolderTest, WritesATokenizerThatFitsTheVocabulary) {
  const std::string dir = Folder();
  for (auto [name, chat_token] : {std::pair{"k3-tiny", "<|open|>"},
                                  std::pair{"kimi-linear-tiny", "<|im_user|>"}}) {
    const ModelConfig config = Named(name);
    ASSERT_TRUE(WriteRandomModelFolder(config, 1, dir).ok());
    auto tokenizer = Tokenizer::Load(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    EXPECT_EQ(tokenizer->vocab_size(), config.vocab_size);
    EXPECT_TRUE(tokenizer->SpecialTokenId(chat_token).has_value()) << name;
    auto ids = tokenizer->Encode("Hello, world!");
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*tokenizer->Decode(*ids), "Hello, world!");
  }
}

// The weights are the checkpoint writer's: the same options reach it.
TEST_F(WriteRandomModelFolderTest, WeightsFollowTheOptions) {
  const std::string dir = Folder();
  RandomCheckpointOptions options;
  options.shards = 2;
  ASSERT_TRUE(WriteRandomModelFolder(Named("k3-tiny"), 1, dir, options).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 2u);
}

// A vocabulary without room for the bytes and the special block gets no tokenizer (and no error).
TEST_F(WriteRandomModelFolderTest, SmallVocabularyGetsNoTokenizer) {
  const std::string dir = Folder();
  ModelConfig config = Named("k3-tiny");
  config.vocab_size = kSmallestTokenizerVocab - 1;
  ASSERT_TRUE(WriteRandomModelFolder(config, 1, dir).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + Tokenizer::kRanksFile));
}

TEST_F(WriteRandomModelFolderTest, BadOptionsWriteNoTokenizer) {
  const std::string dir = Folder();
  RandomCheckpointOptions options;
  options.shards = 0;
  EXPECT_FALSE(WriteRandomModelFolder(Named("k3-tiny"), 1, dir, options).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + Tokenizer::kRanksFile));
}

}  // namespace
}  // namespace k3
