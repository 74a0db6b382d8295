#include "tokenizer/token_constraint.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

Tokenizer Small() {
  auto tokenizer = RandomTokenizer(512, TokenizerFamily::kK3);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

ConstraintPiece Token(const Tokenizer& t, const char* name) {
  return {.kind = ConstraintPiece::Kind::kToken, .token = *t.SpecialTokenId(name)};
}
ConstraintPiece Text(const char* text) {
  return {.kind = ConstraintPiece::Kind::kText, .text = text};
}

// Picks allowed ids at random until none is allowed; returns the decoded text.
std::string Walk(const Tokenizer& t, std::shared_ptr<const TokenVocabulary> vocabulary,
                 std::shared_ptr<const ConstraintShape> shape, std::mt19937& rng) {
  TokenConstraint constraint(vocabulary, shape);
  std::vector<int32_t> ids;
  std::vector<char> allowed;
  while (constraint.Allowed(&allowed) && ids.size() < 300) {
    std::vector<int32_t> choices;
    for (size_t id = 0; id < allowed.size(); ++id) {
      if (allowed[id]) choices.push_back(static_cast<int32_t>(id));
    }
    // Prefer specials (ends) now and then, so that walks finish.
    int32_t id = choices[rng() % choices.size()];
    for (int32_t c : choices) {
      if (t.IsSpecial(c) && rng() % 2) id = c;
    }
    ids.push_back(id);
    constraint.Advance(id);
  }
  return *t.Decode(ids);
}

TEST(TokenConstraintTest, FollowsTheShape) {
  const Tokenizer t = Small();
  auto vocabulary = std::make_shared<TokenVocabulary>(t, t.vocab_size());
  auto grammar = JsonGrammar::FromSchema(nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},
          "required":["ok","n"],"additionalProperties":false})"));
  ASSERT_TRUE(grammar.ok());
  auto shape = std::make_shared<ConstraintShape>();
  for (const char* tool : {"alpha", "beta"}) {
    shape->push_back({Token(t, "<|open|>"), Text(tool), Token(t, "<|sep|>"),
                      {.kind = ConstraintPiece::Kind::kJson, .json = *grammar},
                      Token(t, "<|close|>"), Token(t, "<|end_of_msg|>")});
  }
  std::mt19937 rng(5);
  int seen_alpha = 0;
  for (int i = 0; i < 20; ++i) {
    const std::string text = Walk(t, vocabulary, shape, rng);
    const bool alpha = text.rfind("<|open|>alpha<|sep|>", 0) == 0;
    seen_alpha += alpha;
    ASSERT_TRUE(alpha || text.rfind("<|open|>beta<|sep|>", 0) == 0) << text;
    const size_t json_start = text.find("<|sep|>") + 7;
    const size_t json_end = text.find("<|close|>");
    ASSERT_NE(json_end, std::string::npos) << text;
    EXPECT_EQ(text.substr(json_end), "<|close|><|end_of_msg|>");
    const auto value = nlohmann::json::parse(text.substr(json_start, json_end - json_start));
    EXPECT_TRUE(value["ok"].is_boolean()) << text;
    EXPECT_TRUE(value["n"].is_number_integer()) << text;
    EXPECT_EQ(value.size(), 2u);
  }
  EXPECT_GT(seen_alpha, 0);
  EXPECT_LT(seen_alpha, 20);
}

TEST(TokenConstraintTest, FreeTextUpToItsToken) {
  const Tokenizer t = Small();
  auto vocabulary = std::make_shared<TokenVocabulary>(t, t.vocab_size());
  auto shape = std::make_shared<ConstraintShape>(ConstraintShape{
      {{.kind = ConstraintPiece::Kind::kFreeUntil, .token = *t.SpecialTokenId("<|close|>")},
       Text("think"), Token(t, "<|end_of_msg|>")}});
  TokenConstraint constraint(vocabulary, shape);
  std::vector<char> allowed;
  ASSERT_TRUE(constraint.Allowed(&allowed));
  EXPECT_TRUE(allowed[*t.SpecialTokenId("<|open|>")]);  // anything goes in the free part
  constraint.Advance(*t.SpecialTokenId("<|close|>"));
  ASSERT_TRUE(constraint.Allowed(&allowed));
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|open|>")]);
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|end_of_msg|>")]);
}

}  // namespace
}  // namespace k3
