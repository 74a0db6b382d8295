#include "http_front/output_constraint.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

Tokenizer K3Tokenizer() {
  auto tokenizer = RandomTokenizer(512, TokenizerFamily::kK3);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

CompletionRequest Request(const std::string& body) {
  absl::StatusOr<CompletionRequest> request =
      ParseCompletionRequest(body, Endpoint::kChatCompletions);
  EXPECT_TRUE(request.ok()) << request.status();
  return *request;
}

// The thinking budget the constraint's free piece carries (-1: no free piece).
int Budget(const k3serve::v1::OutputConstraint& constraint) {
  for (const auto& piece : constraint.alternatives(0).pieces()) {
    if (piece.has_free_until_token_id()) return piece.max_free_tokens();
  }
  return -1;
}

constexpr char kSchema[] =
    R"("response_format":{"type":"json_schema","json_schema":{"strict":true,"schema":)"
    R"({"type":"object","required":["a"],"additionalProperties":false,)"
    R"("properties":{"a":{"type":"integer","minimum":10}}}}})";

// The shortest K3 answer of kSchema with thinking on: <|close|>think<|sep|> (1 + 5 + 1),
// <|open|>response<|sep|> (1 + 8 + 1), {"a":10} (8), <|close|>response<|sep|> (10),
// <|close|>message<|sep|> (1 + 7 + 1), <|end_of_msg|> (1): counted by hand from the spec.
constexpr int kShortest = 7 + 10 + 8 + 10 + 9 + 1;

TEST(OutputConstraintTest, ThinkingGetsABudgetThatLeavesRoomForTheAnswer) {
  const Tokenizer t = K3Tokenizer();
  auto by_effort = OutputConstraintOf(
      Request(absl::StrCat(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",)",
                           kSchema, "}")),
      t, 0);
  ASSERT_TRUE(by_effort.ok()) << by_effort.status();
  EXPECT_EQ(Budget(**by_effort), 1024);
  // max_tokens 100: the default budget is half of what the shortest answer leaves.
  auto clamped = OutputConstraintOf(
      Request(absl::StrCat(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100,)",
                           kSchema, "}")),
      t, 100);
  ASSERT_TRUE(clamped.ok()) << clamped.status();
  EXPECT_EQ(Budget(**clamped), (100 - kShortest) / 2);
  auto given = OutputConstraintOf(
      Request(absl::StrCat(
          R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100,"thinking_budget":)",
          100 - kShortest, ",", kSchema, "}")),
      t, 100);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(Budget(**given), 100 - kShortest);
}

TEST(OutputConstraintTest, AMaxTokensThatCannotHoldTheAnswerIsA400) {
  const Tokenizer t = K3Tokenizer();
  auto too_small = OutputConstraintOf(
      Request(absl::StrCat(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":)",
                           kShortest - 1, ",", kSchema, "}")),
      t, kShortest - 1);
  ASSERT_FALSE(too_small.ok());
  EXPECT_EQ(ParamOf(too_small.status()), "max_tokens");
  EXPECT_EQ(HttpStatusOf(too_small.status()), 400);
  auto budget_too_big = OutputConstraintOf(
      Request(absl::StrCat(
          R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":100,)",
          R"("thinking_budget":)", 101 - kShortest, ",", kSchema, "}")),
      t, 100);
  ASSERT_FALSE(budget_too_big.ok());
  EXPECT_EQ(ParamOf(budget_too_big.status()), "max_completion_tokens");
  EXPECT_TRUE(absl::StrContains(budget_too_big.status().message(), "thinking_budget"))
      << budget_too_big.status();
  // Exactly enough is enough.
  EXPECT_TRUE(OutputConstraintOf(
                  Request(absl::StrCat(R"({"messages":[{"role":"user","content":"x"}],)",
                                       R"("max_tokens":)", kShortest, ",", kSchema, "}")),
                  t, kShortest)
                  .ok());
}

TEST(OutputConstraintTest, StrictNamesTheKeywordItCannotEnforce) {
  const Tokenizer t = K3Tokenizer();
  auto format = OutputConstraintOf(
      Request(R"({"messages":[{"role":"user","content":"x"}],"response_format":{
          "type":"json_schema","json_schema":{"strict":true,"schema":{"type":"object",
          "properties":{"d":{"type":"string","pattern":"^[0-9]+$"}}}}}})"),
      t, 0);
  ASSERT_FALSE(format.ok());
  EXPECT_EQ(ParamOf(format.status()), "response_format");
  EXPECT_TRUE(absl::StrContains(format.status().message(), "'pattern'")) << format.status();
  auto tool = OutputConstraintOf(
      Request(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
          "tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{
          "type":"object","properties":{"d":{"type":"string","format":"date"}}}}}]})"),
      t, 0);
  ASSERT_FALSE(tool.ok());
  EXPECT_EQ(ParamOf(tool.status()), "tools");
  EXPECT_TRUE(absl::StrContains(tool.status().message(), "'format'")) << tool.status();
  // Without strict the same schemas are best effort.
  EXPECT_TRUE(OutputConstraintOf(
                  Request(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
                      "tools":[{"type":"function","function":{"name":"f","parameters":{
                      "type":"object","properties":{"d":{"type":"string","format":"date"}}}}}]})"),
                  t, 0)
                  .ok());
}

}  // namespace
}  // namespace k3
