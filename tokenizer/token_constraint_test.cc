#include "tokenizer/token_constraint.h"

#include <algorithm>
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

ConstraintPiece FreeUntil(const Tokenizer& t, int max_free_tokens = -1) {
  return {.kind = ConstraintPiece::Kind::kFreeUntil,
          .token = *t.SpecialTokenId("<|close|>"),
          .max_free_tokens = max_free_tokens};
}

TEST(TokenConstraintTest, FreeTextUpToItsToken) {
  const Tokenizer t = Small();
  auto vocabulary = std::make_shared<TokenVocabulary>(t, t.vocab_size());
  auto shape = std::make_shared<ConstraintShape>(
      ConstraintShape{{FreeUntil(t), Text("think"), Token(t, "<|end_of_msg|>")}});
  TokenConstraint constraint(vocabulary, shape);
  std::vector<char> allowed;
  ASSERT_TRUE(constraint.Allowed(&allowed));
  // Text goes in the free part, but no special token except its own: the answer cannot end
  // (issue 38: <|end_of_msg|> inside the think section left structured output empty).
  EXPECT_TRUE(allowed[*t.Encode("a")->begin()]);
  EXPECT_TRUE(allowed[*t.SpecialTokenId("<|close|>")]);
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|open|>")]);
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|end_of_msg|>")]);
  constraint.Advance(*t.SpecialTokenId("<|close|>"));
  ASSERT_TRUE(constraint.Allowed(&allowed));
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|open|>")]);
  EXPECT_FALSE(allowed[*t.SpecialTokenId("<|end_of_msg|>")]);
}

TEST(TokenConstraintTest, ABudgetClosesTheFreeText) {
  const Tokenizer t = Small();
  auto vocabulary = std::make_shared<TokenVocabulary>(t, t.vocab_size());
  auto shape = std::make_shared<ConstraintShape>(
      ConstraintShape{{FreeUntil(t, 3), Token(t, "<|end_of_msg|>")}});
  TokenConstraint constraint(vocabulary, shape);
  std::vector<char> allowed;
  const int32_t a = *t.Encode("a")->begin();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(constraint.Allowed(&allowed));
    EXPECT_TRUE(allowed[a]);
    constraint.Advance(a);
  }
  ASSERT_TRUE(constraint.Allowed(&allowed));
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1);
  EXPECT_TRUE(allowed[*t.SpecialTokenId("<|close|>")]);
}

// With a token limit every walk ends within it, whatever it picks: the think section closes in
// time and the JSON gets its required members; the value parses and validates (here: what
// nlohmann parses and the schema's members, the python validator checks the server's answers).
TEST(TokenConstraintTest, ATokenLimitAlwaysLeavesRoomToFinish) {
  const Tokenizer t = Small();
  auto vocabulary = std::make_shared<TokenVocabulary>(t, t.vocab_size());
  ASSERT_TRUE(vocabulary->has_byte_tokens());
  auto grammar = JsonGrammar::FromSchema(nlohmann::ordered_json::parse(
      R"({"type":"object","additionalProperties":false,"required":["name","tags","n"],
          "properties":{"name":{"type":"string","minLength":2},
          "tags":{"type":"array","minItems":2,"items":{"type":"string"}},
          "n":{"type":"integer","minimum":100000}}})"));
  ASSERT_TRUE(grammar.ok());
  auto shape = std::make_shared<ConstraintShape>(ConstraintShape{
      {FreeUntil(t), Token(t, "<|sep|>"), {.kind = ConstraintPiece::Kind::kJson, .json = *grammar},
       Token(t, "<|close|>"), Token(t, "<|end_of_msg|>")}});
  const int shortest = MinTokens((*shape)[0]);
  EXPECT_EQ(shortest, 1 + 1 + static_cast<int>(std::string(R"({"name":"aa","tags":["",""],"n":100000})").size()) + 2);
  std::mt19937 rng(7);
  for (int limit : {shortest, shortest + 1, shortest + 5, shortest + 40, shortest + 200}) {
    for (int i = 0; i < 10; ++i) {
      TokenConstraint constraint(vocabulary, shape, limit);
      std::vector<int32_t> ids;
      std::vector<char> allowed;
      while (constraint.Allowed(&allowed)) {
        std::vector<int32_t> choices;
        for (size_t id = 0; id < allowed.size(); ++id) {
          if (allowed[id]) choices.push_back(static_cast<int32_t>(id));
        }
        // Mostly text (long strings, long thinking): the limit, not luck, ends the walk.
        int32_t id = choices[rng() % choices.size()];
        if (rng() % 8 == 0) {
          for (int32_t c : choices) {
            if (t.IsSpecial(c)) id = c;
          }
        }
        ids.push_back(id);
        constraint.Advance(id);
      }
      ASSERT_LE(static_cast<int>(ids.size()), limit);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.back(), *t.SpecialTokenId("<|end_of_msg|>")) << limit;
      const std::string text = *t.Decode(ids);
      const size_t json_start = text.find("<|sep|>") + 7;
      const size_t json_end = text.rfind("<|close|>");
      const auto value = nlohmann::json::parse(text.substr(json_start, json_end - json_start),
                                               nullptr, false);
      ASSERT_FALSE(value.is_discarded()) << text;
      EXPECT_GE(value["name"].get<std::string>().size(), 2u);
      EXPECT_GE(value["tags"].size(), 2u);
      EXPECT_GE(value["n"].get<int64_t>(), 100000);
    }
  }
}

}  // namespace
}  // namespace k3
