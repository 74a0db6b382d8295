#include "http_front/openai_protocol.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using nlohmann::json;

absl::Status ParseError(const std::string& body, Endpoint endpoint = Endpoint::kChatCompletions) {
  return ParseCompletionRequest(body, endpoint).status();
}

TEST(OpenAiProtocolTest, ParsesAChatRequest) {
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
          "max_tokens":7,"temperature":0.5,"top_p":0.9,"seed":42,"stop":["a","b"],"stream":true,
          "stream_options":{"include_usage":true},"n":1,"user":"ignored",
          "chat_template_kwargs":{"thinking":true}})",
      Endpoint::kChatCompletions);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->model, "m");
  ASSERT_EQ(request->messages.size(), 2u);
  EXPECT_EQ(request->messages[1].role, "user");
  EXPECT_EQ(request->messages[1].content, "hi there");
  EXPECT_EQ(request->max_tokens, 7);
  EXPECT_FLOAT_EQ(*request->temperature, 0.5f);
  EXPECT_FLOAT_EQ(*request->top_p, 0.9f);
  EXPECT_EQ(request->seed, 42u);
  EXPECT_EQ(request->stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(request->stream);
  EXPECT_TRUE(request->include_usage);
  EXPECT_TRUE(request->thinking);
}

TEST(OpenAiProtocolTest, ParsesCompletionPromptsAsTextOrIds) {
  absl::StatusOr<CompletionRequest> text =
      ParseCompletionRequest(R"({"prompt":"once upon","stop":"x"})", Endpoint::kCompletions);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->prompt_text, "once upon");
  EXPECT_EQ(text->stop, std::vector<std::string>{"x"});
  absl::StatusOr<CompletionRequest> ids =
      ParseCompletionRequest(R"({"prompt":[[1,2,3]]})", Endpoint::kCompletions);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_FALSE(ids->prompt_text.has_value());
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(OpenAiProtocolTest, BadInputIsInvalidArgumentNamingTheField) {
  struct Case {
    std::string body;
    std::string param;
    Endpoint endpoint = Endpoint::kChatCompletions;
  };
  const Case cases[] = {
      {"{not json", ""},
      {"[1]", ""},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":1.5})", "seed"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[""]})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":1}})",
       "chat_template_kwargs"},
      {R"({"prompt":["a","b"]})", "prompt", Endpoint::kCompletions},
      {R"({"prompt":[1,-2]})", "prompt", Endpoint::kCompletions},
      {R"({"prompt":""})", "prompt", Endpoint::kCompletions},
      {R"({})", "prompt", Endpoint::kCompletions},
  };
  for (const Case& c : cases) {
    const absl::Status status = ParseError(c.body, c.endpoint);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << c.body << ": " << status;
    EXPECT_EQ(ParamOf(status), c.param) << c.body;
    EXPECT_EQ(HttpStatusOf(status), 400);
  }
}

TEST(OpenAiProtocolTest, ErrorBodyHasOpenAisShape) {
  const json body = json::parse(ErrorBody(ParseError(R"({"messages":[]})")));
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "messages");
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_TRUE(body["error"].contains("code"));
  const json auth = json::parse(ErrorBody(absl::UnauthenticatedError("no key")));
  EXPECT_TRUE(auth["error"]["param"].is_null());
  EXPECT_EQ(HttpStatusOf(absl::UnauthenticatedError("")), 401);
  EXPECT_EQ(HttpStatusOf(absl::UnavailableError("")), 503);
  EXPECT_EQ(HttpStatusOf(absl::UnimplementedError("tool messages")), 400);
  EXPECT_EQ(HttpStatusOf(absl::InternalError("")), 500);
}

TEST(OpenAiProtocolTest, ChatChunksCarryDeltas) {
  const ResponseHead head{"chatcmpl-1", 5, "k3", Endpoint::kChatCompletions};
  const std::string event = CompletionChunkEvent(head, "hé", /*first=*/true, "");
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  ASSERT_EQ(event.substr(event.size() - 2), "\n\n");
  const json chunk = json::parse(event.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "hé");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(CompletionChunkEvent(head, "", false, "length").substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
}

TEST(OpenAiProtocolTest, CompletionBodyCountsUsage) {
  const ResponseHead head{"cmpl-1", 5, "k3", Endpoint::kCompletions};
  const json body = json::parse(CompletionBody(head, "abc", "stop", {3, 4}));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "abc");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

}  // namespace
}  // namespace k3
