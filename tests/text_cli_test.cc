// `k3serve generate --prompt` and `k3serve chat --model`, run as the binary: their text must be
// the detokenized greedy tokens of the single-process engine for the same prompt ids.
#include <stdio.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/text_prompt.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

constexpr int kMaxNewTokens = 8;

// The command's stdout (stderr goes to the test log).
std::string Output(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return out;
}

// The greedy answer to `ids`, cut at `stop` (excluded), as display text.
std::string Expected(const std::string& model, const Tokenizer& tokenizer,
                     const std::vector<int32_t>& ids, std::optional<int32_t> stop) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> tokens =
      SingleProcessTokens(model, {ids}, kMaxNewTokens);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  std::vector<int32_t> answer = (*tokens)[0];
  if (stop.has_value()) answer.erase(std::find(answer.begin(), answer.end(), *stop), answer.end());
  EXPECT_FALSE(answer.empty());
  return *DecodeForDisplay(tokenizer, answer);
}

class TextCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = RandomCheckpointDir("k3-tiny", 3);
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_.emplace(*std::move(tokenizer));
    binary_ = std::filesystem::absolute("k3serve").string();
  }

  std::string model_;
  std::optional<Tokenizer> tokenizer_;
  std::string binary_;
};

TEST_F(TextCliTest, GeneratePromptPrintsTheAnswerAsText) {
  const std::string prompt = "The sky is";
  const std::string out = Output(absl::StrCat(binary_, " generate --model ", model_,
                                              " --prompt '", prompt, "' --max-new-tokens ",
                                              kMaxNewTokens, " --temperature 0"));
  EXPECT_EQ(out, Expected(model_, *tokenizer_, *tokenizer_->Encode(prompt), std::nullopt) + "\n");
}

TEST_F(TextCliTest, ChatStreamsEachAnswerAndKeepsTheConversation) {
  const std::string out =
      Output(absl::StrCat("printf 'Hello\\nAgain\\n' | ", binary_, " chat --model ", model_,
                          " --max-new-tokens ", kMaxNewTokens));
  const int32_t turn_end = *TurnEndId(*tokenizer_);
  std::vector<ChatMessage> messages = {{.role = "user", .content = "Hello"}};
  const std::string first = Expected(
      model_, *tokenizer_, *RenderChat(*tokenizer_, messages, {.thinking = false}), turn_end);
  // The second answer follows the whole conversation.
  messages.push_back({.role = "assistant", .content = first});
  messages.push_back({.role = "user", .content = "Again"});
  const std::string second = Expected(
      model_, *tokenizer_, *RenderChat(*tokenizer_, messages, {.thinking = false}), turn_end);
  EXPECT_EQ(out, first + "\n" + second + "\n");
}

// `generate` ends at the model's eos_token_id (printed last), and goes on past it with
// --ignore-eos: a copy of the checkpoint names the third greedy token as its eos token.
TEST_F(TextCliTest, GenerateStopsAtEosUnlessIgnoreEos) {
  const std::vector<int32_t> ids = {5, 9, 2, 6};
  absl::StatusOr<std::vector<std::vector<int32_t>>> tokens =
      SingleProcessTokens(model_, {ids}, kMaxNewTokens);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const std::vector<int32_t>& greedy = (*tokens)[0];
  ASSERT_EQ(greedy.size(), static_cast<size_t>(kMaxNewTokens));
  const int32_t eos = greedy[2];
  const size_t first_eos = std::find(greedy.begin(), greedy.end(), eos) - greedy.begin();

  const std::string copy = ::testing::TempDir() + "/eos_model";
  std::filesystem::remove_all(copy);
  std::filesystem::create_directories(copy);
  for (const auto& entry : std::filesystem::directory_iterator(model_)) {
    if (entry.path().filename() == "config.json") continue;
    std::filesystem::create_symlink(std::filesystem::absolute(entry.path()),
                                    copy + "/" + entry.path().filename().string());
  }
  std::string config;
  {
    std::ifstream in(model_ + "/config.json");
    config.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string key = "\"eos_token_id\": ";
  const size_t at = config.find(key);
  ASSERT_NE(at, std::string::npos) << config;
  const size_t end = config.find_first_of(",\n}", at + key.size());
  config.replace(at + key.size(), end - at - key.size(), std::to_string(eos));
  std::ofstream(copy + "/config.json") << config;

  auto expect = [&](size_t count) {
    std::string line;
    for (size_t i = 0; i < count; ++i) absl::StrAppend(&line, i ? " " : "", greedy[i]);
    return line + "\n";
  };
  const std::string command = absl::StrCat(binary_, " generate --model ", copy,
                                           " --tokens 5,9,2,6 --max-new-tokens ", kMaxNewTokens);
  EXPECT_EQ(Output(command), expect(first_eos + 1));
  EXPECT_EQ(Output(command + " --ignore-eos"), expect(kMaxNewTokens));
}

}  // namespace
}  // namespace k3
