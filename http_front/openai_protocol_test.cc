#include "http_front/openai_protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

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
          "chat_template_kwargs":{"thinking":false}})",
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
  EXPECT_FALSE(request->chat.thinking);
}

// Before issue 23 tools, tool_choice, tool calls, tool results and reasoning were ignored or
// refused, and thinking was off unless asked for.
TEST(OpenAiProtocolTest, ParsesToolsReasoningAndResponseFormat) {
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(
      R"({"messages":[{"role":"user","content":"x","name":"ann"},
          {"role":"assistant","content":null,"reasoning_content":"hmm","tool_calls":[
            {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
          {"role":"tool","tool_call_id":"c1","content":"42"}],
          "tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}],
          "tool_choice":{"type":"function","function":{"name":"f"}},"reasoning_effort":"low",
          "response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{
            "type":"object"}}}})",
      Endpoint::kChatCompletions);
  ASSERT_TRUE(request.ok()) << request.status();
  ASSERT_EQ(request->messages.size(), 3u);
  EXPECT_EQ(request->messages[0].name, "ann");
  EXPECT_EQ(request->messages[1].reasoning, "hmm");
  ASSERT_EQ(request->messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(request->messages[1].tool_calls[0].id, "c1");
  EXPECT_EQ(request->messages[1].tool_calls[0].name, "f");
  EXPECT_EQ(request->messages[1].tool_calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(request->messages[2].tool_call_id, "c1");
  EXPECT_EQ(request->tool_choice, "function");
  EXPECT_EQ(request->tool_choice_function, "f");
  EXPECT_TRUE(request->chat.thinking);
  EXPECT_EQ(request->chat.thinking_effort, "low");
  // The client's key order is kept (Kimi's template writes the tools as they came).
  EXPECT_EQ(request->chat.tools.dump(), R"([{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}])");
  EXPECT_EQ(request->chat.response_format, "json_schema");
  EXPECT_EQ(request->chat.response_schema.dump(), R"({"type":"object"})");

  absl::StatusOr<CompletionRequest> plain =
      ParseCompletionRequest(R"({"messages":[{"role":"user","content":"x"}]})",
                             Endpoint::kChatCompletions);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->chat.thinking);  // the template's default
  EXPECT_EQ(plain->chat.thinking_effort, "max");
  EXPECT_EQ(plain->tool_choice, "none");  // no tools
}

TEST(OpenAiProtocolTest, ChatAnswersCarryReasoningAndToolCalls) {
  const ResponseHead head{"chatcmpl-1", 5, "k3", Endpoint::kChatCompletions};
  const Choice answer{.reasoning = "think",
                      .tool_calls = {{0, "call_0", "f", R"({"a": 1})"}},
                      .finish_reason = "tool_calls"};
  const json body = json::parse(CompletionBody(head, {answer}, {1, 2}));
  const json& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["reasoning_content"], "think");
  EXPECT_EQ(message["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"a": 1})");
  EXPECT_FALSE(message["tool_calls"][0].contains("index"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  const json first = json::parse(
      CompletionChunkEvent(head, {.reasoning = "think", .tool_calls = answer.tool_calls}, false)
          .substr(6));
  EXPECT_EQ(first["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(first["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(first["choices"][0]["delta"]["reasoning_content"], "think");
  const Choice more{.tool_calls = {{0, "", "", "}"}}};
  EXPECT_TRUE(HasDelta(more));
  EXPECT_FALSE(HasDelta(Choice{.index = 1}));
  const json next = json::parse(CompletionChunkEvent(head, more, false).substr(6));
  const json& piece = next["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(piece["index"], 0);
  EXPECT_FALSE(piece.contains("id"));
  EXPECT_FALSE(piece["function"].contains("name"));
  EXPECT_EQ(piece["function"]["arguments"], "}");
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
      {R"({"messages":[{"role":"user","content":"x"}],"n":0})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":129})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
       "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":2})", "logprobs"},
      {R"({"prompt":"x","logprobs":6})", "logprobs", Endpoint::kCompletions},
      {R"({"messages":[{"role":"user","content":"x"}],"skip_special_tokens":0})",
       "skip_special_tokens"},
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
      {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"huge"})",
       "reasoning_effort"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes",
           "tools":[{"type":"function","function":{"name":"f"}}]})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function",
           "function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}]})",
       "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", "messages"},
      {R"({"messages":[{"role":"assistant","tool_calls":[{"function":{}}]}]})", "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
       "response_format"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format"},
      // Issue 38: ranges as OpenAI documents them, unimplemented effects refused, tool messages
      // that answer no call, strict's flag and the thinking budget's type.
      {R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":5})", "presence_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5})",
       "presence_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"frequency_penalty":-2.5})",
       "frequency_penalty"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":1}})", "logit_bias"},
      {R"({"prompt":"x","echo":true})", "echo", Endpoint::kCompletions},
      {R"({"prompt":"x","suffix":"end"})", "suffix", Endpoint::kCompletions},
      {R"({"prompt":"x","best_of":2})", "best_of", Endpoint::kCompletions},
      {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})",
       "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"1"}]})",
       "messages"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a",
           "type":"function","function":{"name":"f","arguments":"{}"}}]},
           {"role":"tool","tool_call_id":"b","content":"1"}]})",
       "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"thinking_budget":-1})", "thinking_budget"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
           "json_schema":{"schema":{},"strict":"yes"}}})",
       "response_format"},
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

TEST(OpenAiProtocolTest, NeutralValuesOfUnimplementedFieldsPass) {
  EXPECT_TRUE(ParseCompletionRequest(
                  R"({"prompt":"x","echo":false,"suffix":"","best_of":1,"presence_penalty":0,
                      "frequency_penalty":0,"logit_bias":{}})",
                  Endpoint::kCompletions)
                  .ok());
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(
      R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":7,
          "thinking_budget":0,"response_format":{"type":"json_schema",
          "json_schema":{"schema":{"type":"object"},"strict":true}}})",
      Endpoint::kChatCompletions);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->max_tokens_param, "max_completion_tokens");
  EXPECT_EQ(request->thinking_budget, 0);
  EXPECT_TRUE(request->response_format_strict);
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
  const std::string event = CompletionChunkEvent(head, {.text = "hé"}, /*first=*/true);
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  ASSERT_EQ(event.substr(event.size() - 2), "\n\n");
  const json chunk = json::parse(event.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "hé");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  const json last =
      json::parse(CompletionChunkEvent(head, {.index = 1, .finish_reason = "length"}, false)
                      .substr(6));
  EXPECT_EQ(last["choices"][0]["index"], 1);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
}

TEST(OpenAiProtocolTest, CompletionBodyCountsUsage) {
  const ResponseHead head{"cmpl-1", 5, "k3", Endpoint::kCompletions};
  const json body = json::parse(CompletionBody(
      head, {{.text = "abc", .finish_reason = "stop"}, {.index = 1, .finish_reason = "length"}},
      {3, 4}));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "abc");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

TEST(OpenAiProtocolTest, DeveloperMessagesAreSystemMessages) {
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(
      R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}]})",
      Endpoint::kChatCompletions);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->messages[0].role, "system");
}

TEST(OpenAiProtocolTest, ParsesChoicesLogprobsAndSpecialTokens) {
  absl::StatusOr<CompletionRequest> chat = ParseCompletionRequest(
      R"({"messages":[{"role":"user","content":"x"}],"n":3,"logprobs":true,"top_logprobs":2,
          "skip_special_tokens":false})",
      Endpoint::kChatCompletions);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->n, 3);
  EXPECT_EQ(chat->top_logprobs, 2);
  EXPECT_FALSE(chat->skip_special_tokens);
  absl::StatusOr<CompletionRequest> plain = ParseCompletionRequest(
      R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})", Endpoint::kChatCompletions);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->n, 1);
  EXPECT_FALSE(plain->top_logprobs.has_value());
  EXPECT_TRUE(plain->skip_special_tokens);
  absl::StatusOr<CompletionRequest> legacy =
      ParseCompletionRequest(R"({"prompt":"x","logprobs":0})", Endpoint::kCompletions);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->top_logprobs, 0);
}

// The two APIs' shapes of logprobs (OpenAI's reference: chat `logprobs.content[]` with token,
// logprob, bytes and top_logprobs; completions' parallel arrays with text offsets).
TEST(OpenAiProtocolTest, LogprobsHaveEachApisShape) {
  const std::vector<TokenLogprob> logprobs = {{"hé", -0.5f, {{"hé", -0.5f}, {"x", -1.25f}}},
                                               {"!", -2.f, {{"?", -1.f}, {"!", -2.f}}}};
  const json chat = json::parse(CompletionBody({"c", 1, "k3", Endpoint::kChatCompletions},
                                               {{.text = "hé!", .logprobs = logprobs}}, {1, 2}));
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "hé");
  EXPECT_EQ(content[0]["bytes"], json({0x68, 0xc3, 0xa9}));
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], "?");
  EXPECT_EQ(content[1]["top_logprobs"][1]["logprob"], -2.0);
  const json completion = json::parse(CompletionBody(
      {"c", 1, "k3", Endpoint::kCompletions}, {{.text = "hé!", .logprobs = logprobs}}, {1, 2}));
  const json& lp = completion["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"hé", "!"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -2.0}));
  EXPECT_EQ(lp["top_logprobs"][1]["?"], -1.0);
  EXPECT_EQ(lp["text_offset"], json({0, 3}));
}

// Logprobs read back as a double and rounded to float (Math.fround) are the sampler's float bit
// for bit, in both APIs' shapes, over 20000 random negative floats of every exponent (checked
// against the float itself, not a printed form); almost all print in a float's 9 digits or fewer.
TEST(OpenAiProtocolTest, LogprobsRoundTripExactly) {
  std::mt19937 rng(39);
  std::vector<float> values = {-0.0f, -1e-30f, -0.1f, -1.0f / 3.0f, -16.635532f,
                               -std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::min(), -87.33655f, -1e30f};
  while (values.size() < 20000) {
    const uint32_t bits = static_cast<uint32_t>(rng()) | 0x80000000u;  // negative, any exponent
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isfinite(v)) values.push_back(v);
  }
  int numbers = 0, short_numbers = 0;
  for (size_t i = 0; i < values.size(); i += 10) {
    std::vector<TokenLogprob> logprobs;
    for (size_t j = i; j < std::min(values.size(), i + 10); ++j) {
      logprobs.push_back({"t", values[j], {{"a", values[j]}}});
    }
    for (Endpoint endpoint : {Endpoint::kChatCompletions, Endpoint::kCompletions}) {
      const std::string body =
          CompletionBody({"c", 1, "k3", endpoint}, {{.text = "t", .logprobs = logprobs}}, {1, 1});
      const json lp = json::parse(body)["choices"][0]["logprobs"];
      for (size_t j = 0; j < logprobs.size(); ++j) {
        const json& number = endpoint == Endpoint::kChatCompletions
                                 ? lp["content"][j]["logprob"]
                                 : lp["token_logprobs"][j];
        const json& top = endpoint == Endpoint::kChatCompletions
                              ? lp["content"][j]["top_logprobs"][0]["logprob"]
                              : lp["top_logprobs"][j]["a"];
        for (const json* read : {&number, &top}) {
          const float back = static_cast<float>(read->get<double>());
          ASSERT_EQ(std::memcmp(&back, &logprobs[j].logprob, sizeof(float)), 0)
              << read->dump() << " for " << logprobs[j].logprob;
          // Significant digits: the mantissa's, without leading and trailing zeros.
          const std::string printed = read->dump();
          std::string digits;
          for (char c : printed.substr(0, printed.find_first_of("eE"))) {
            if (std::isdigit(static_cast<unsigned char>(c))) digits.push_back(c);
          }
          const size_t first = digits.find_first_not_of('0');
          const size_t significant =
              first == std::string::npos ? 0 : digits.find_last_not_of('0') - first + 1;
          if (significant <= 9) ++short_numbers;
          ++numbers;
        }
      }
    }
  }
  // A float's shortest digits, as JSON's writer prints the double nearest to them (its Grisu2
  // is not always shortest: a few come out with 17 digits, as exact).
  EXPECT_GE(short_numbers, numbers * 95 / 100);
}

TEST(OpenAiProtocolTest, ModelBodyIsOneModelObject) {
  const json model = json::parse(ModelBody("k3"));
  EXPECT_EQ(model["id"], "k3");
  EXPECT_EQ(model["object"], "model");
}

}  // namespace
}  // namespace k3
