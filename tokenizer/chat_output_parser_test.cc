#include "tokenizer/chat_output_parser.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/random_tokenizer.h"
#include "tokenizer/streaming_decoder.h"

namespace k3 {
namespace {

using nlohmann::json;

// Chats rendered by the release's Jinja templates with Python's jinja2
// (testdata/chat/make_chat_template_goldens.py): each assistant turn there is what the model
// would have generated after the generation prompt, so parsing it must give back the request's
// reasoning, content and tool calls.
constexpr char kGoldens[] = "tokenizer/testdata/chat/chat_template_goldens.json";

json Goldens() {
  std::ifstream in(kGoldens);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

Tokenizer Small(TokenizerFamily family) {
  auto tokenizer = RandomTokenizer(512, family);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

// Feeds `generated` token by token, as the front does, and sums the deltas.
ChatDelta Parse(const Tokenizer& t, ChatFormat format, bool thinking, const std::string& generated,
                bool* done) {
  auto ids = t.EncodeWithSpecialTokens(generated);
  EXPECT_TRUE(ids.ok());
  ChatOutputParser parser(format, thinking, "call_");
  StreamingDecoder decoder(t);
  ChatDelta total;
  for (int32_t id : *ids) {
    ChatDelta delta;
    if (t.IsSpecial(id)) {
      std::string name;
      EXPECT_TRUE(t.AppendTokenBytes(id, &name).ok());
      parser.Special(name, &delta);
    } else {
      parser.Text(*decoder.Push(id), &delta);
    }
    total.Append(delta);
  }
  *done = parser.done();
  return total;
}

void ExpectSameArguments(const std::string& parsed, const std::string& sent) {
  const json expected = json::parse(sent, nullptr, false);
  if (expected.is_object()) {
    EXPECT_EQ(json::parse(parsed, nullptr, false), expected) << parsed << " vs " << sent;
  } else {
    EXPECT_EQ(parsed, sent);  // not an object: the template wrote it as it was
  }
}

void CheckAssistantTurns(const json& golden, int* checked_calls) {
  const bool k3 = golden["family"] == "k3";
  const json& request = golden["request"];
  const bool thinking =
      k3 && !(request.contains("chat_template_kwargs") &&
              request["chat_template_kwargs"].value("thinking", true) == false);
  const std::string prompt = k3 ? absl::StrCat("<|open|>message role=\"assistant\"<|sep|>",
                                               thinking ? "<|open|>think<|sep|>"
                                                        : "<|open|>response<|sep|>")
                                : "<|im_assistant|>assistant<|im_middle|>";
  const std::string end = k3 ? "<|end_of_msg|>" : "<|im_end|>";
  const Tokenizer t = Small(k3 ? TokenizerFamily::kK3 : TokenizerFamily::kKimi);
  const std::string& rendered = golden["rendered"].get_ref<const std::string&>();
  size_t at = 0;
  int kimi_calls = 0;
  for (const json& message : request["messages"]) {
    if (message["role"] != "assistant") continue;
    at = rendered.find(prompt, at);
    ASSERT_NE(at, std::string::npos) << golden["name"];
    at += prompt.size();
    const size_t stop = rendered.find(end, at) + end.size();
    bool done = false;
    const ChatDelta answer =
        Parse(t, k3 ? ChatFormat::kK3 : ChatFormat::kKimi, thinking, rendered.substr(at, stop - at),
              &done);
    EXPECT_TRUE(done);
    EXPECT_EQ(answer.content, message["content"].is_string() ? message["content"] : "");
    EXPECT_EQ(answer.reasoning, thinking ? message.value("reasoning_content", "") : "");
    const json calls = message.value("tool_calls", json::array());
    ASSERT_EQ(answer.tool_calls.size(), calls.size()) << golden["name"];
    for (size_t i = 0; i < calls.size(); ++i) {
      const ToolCallDelta& call = answer.tool_calls[i];
      EXPECT_EQ(call.index, static_cast<int>(i));
      EXPECT_EQ(call.name, calls[i]["function"]["name"]);
      EXPECT_EQ(call.id, k3 ? absl::StrCat("call_", i)
                            : absl::StrCat("functions.", call.name, ":", kimi_calls++));
      ExpectSameArguments(call.arguments, calls[i]["function"]["arguments"]);
      ++*checked_calls;
    }
  }
}

TEST(ChatOutputParserTest, GivesBackWhatTheTemplateRendered) {
  int checked_calls = 0;
  for (const json& golden : Goldens()) {
    SCOPED_TRACE(golden["name"].get<std::string>());
    CheckAssistantTurns(golden, &checked_calls);
  }
  EXPECT_GE(checked_calls, 9);  // three calls in each of three renderings
}

TEST(ChatOutputParserTest, TagLookAlikeTextIsText) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  ChatOutputParser parser(ChatFormat::kK3, /*thinking=*/false, "call_");
  ChatDelta delta;
  parser.Text("<|open|>tools<|sep|>", &delta);
  EXPECT_EQ(delta.content, "<|open|>tools<|sep|>");
  EXPECT_TRUE(delta.tool_calls.empty());
}

TEST(ChatOutputParserTest, CallWithoutArgumentsHasAnEmptyObject) {
  ChatOutputParser parser(ChatFormat::kK3, /*thinking=*/false, "c");
  ChatDelta delta;
  for (const char* piece : {"<|close|>", "response", "<|sep|>", "<|open|>", "tools", "<|sep|>",
                            "<|open|>", "call tool=\"f\" index=\"1\"", "<|sep|>", "<|close|>",
                            "call", "<|sep|>"}) {
    ChatDelta d;
    if (piece[0] == '<') {
      parser.Special(piece, &d);
    } else {
      parser.Text(piece, &d);
    }
    delta.Append(d);
  }
  ASSERT_EQ(delta.tool_calls.size(), 1u);
  EXPECT_EQ(delta.tool_calls[0].id, "c0");
  EXPECT_EQ(delta.tool_calls[0].arguments, "{}");
}

// Issue 38: hand-written K3 answers (the chat template's format, K3-TOKENIZER.md "Tools and
// thinking"), as the model generates them after a thinking-on generation prompt. Each gives the
// calls the format defines, fed token by token and whole, or (cut inside a call) a clean error
// with the calls so far; never a crash or a dropped call.
struct CorpusCase {
  const char* name;
  std::string generated;
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (JSON text)
  bool done = true;
  bool whole = true;  // Finish is OK
};

std::vector<CorpusCase> Corpus() {
  const std::string think = "I should look it up.<|close|>think<|sep|>";
  const std::string weather =
      R"(<|open|>call tool="get_weather" index="1"<|sep|><|open|>json type="object"<|sep|>)"
      R"({"city":"Paris","days":3}<|close|>json<|sep|><|close|>call<|sep|>)";
  const std::string end = "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  const std::string no_response = "<|open|>response<|sep|><|close|>response<|sep|>";
  return {
      {"one call", think + no_response + "<|open|>tools<|sep|>" + weather + end,
       "I should look it up.", "", {{"get_weather", R"({"city":"Paris","days":3})"}}},
      {"several calls, typed arguments, nested JSON and unicode",
       think + no_response + "<|open|>tools<|sep|>" +
           R"(<|open|>call tool="search" index="1"<|sep|>)"
           R"(<|open|>argument key="q" type="string"<|sep|>héllo "wörld" 😀<|close|>argument<|sep|>)"
           R"(<|open|>argument key="n" type="number"<|sep|>5<|close|>argument<|sep|>)"
           R"(<|close|>call<|sep|>)"
           R"(<|open|>call tool="store" index="2"<|sep|><|open|>json type="object"<|sep|>)"
           R"({"doc":{"k":[1,{"z":"üé"}],"e":{}},"t":"a<b>"}<|close|>json<|sep|>)"
           R"(<|close|>call<|sep|>)" +
           weather + end,
       "I should look it up.",
       "",
       {{"search", R"({"q":"héllo \"wörld\" 😀","n":5})"},
        {"store", R"({"doc":{"k":[1,{"z":"üé"}],"e":{}},"t":"a<b>"})"},
        {"get_weather", R"({"city":"Paris","days":3})"}}},
      {"text before the call",
       think + "<|open|>response<|sep|>Let me check.<|close|>response<|sep|><|open|>tools<|sep|>" +
           weather + end,
       "I should look it up.", "Let me check.", {{"get_weather", R"({"city":"Paris","days":3})"}}},
      {"missing end markers", think + no_response + "<|open|>tools<|sep|>" + weather,
       "I should look it up.", "", {{"get_weather", R"({"city":"Paris","days":3})"}},
       /*done=*/false},
      {"missing the call's close tag",
       think + no_response + "<|open|>tools<|sep|>" +
           R"(<|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" type="string"<|sep|>)"
           R"(x<|close|>argument<|sep|>)",
       "I should look it up.", "", {{"f", R"({"a":"x"})"}}, /*done=*/false},
      {"truncated mid-arguments",
       think + no_response + "<|open|>tools<|sep|>" +
           R"(<|open|>call tool="get_weather" index="1"<|sep|><|open|>json type="object"<|sep|>)"
           R"({"city":"Pa)",
       "I should look it up.", "", {{"get_weather", R"({"city":"Pa)"}}, /*done=*/false,
       /*whole=*/false},
      {"truncated in the think section", "I should", "I should", "", {}, /*done=*/false},
  };
}

// Feeds `generated`: token by token as the front does (`whole` false), or each text between
// special tokens at once.
ChatDelta ParseCorpus(const Tokenizer& t, const std::string& generated, bool by_token,
                      bool* done, absl::Status* finish) {
  auto ids = t.EncodeWithSpecialTokens(generated);
  EXPECT_TRUE(ids.ok());
  ChatOutputParser parser(ChatFormat::kK3, /*thinking=*/true, "call_");
  StreamingDecoder decoder(t);
  ChatDelta total;
  std::string text;
  auto flush = [&] {
    ChatDelta delta;
    if (!text.empty()) parser.Text(text, &delta);
    text.clear();
    total.Append(delta);
  };
  for (int32_t id : *ids) {
    ChatDelta delta;
    if (t.IsSpecial(id)) {
      flush();
      std::string name;
      EXPECT_TRUE(t.AppendTokenBytes(id, &name).ok());
      parser.Special(name, &delta);
    } else if (by_token) {
      parser.Text(*decoder.Push(id), &delta);
    } else {
      text += *decoder.Push(id);
    }
    total.Append(delta);
  }
  flush();
  ChatDelta closing;
  *finish = parser.Finish(&closing);
  total.Append(closing);
  *done = parser.done();
  return total;
}

TEST(ChatOutputParserTest, HandWrittenToolCallCorpus) {
  const Tokenizer t = Small(TokenizerFamily::kK3);
  for (const CorpusCase& c : Corpus()) {
    for (bool by_token : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.name, by_token ? ", token by token" : ", whole"));
      bool done = false;
      absl::Status finish;
      const ChatDelta got = ParseCorpus(t, c.generated, by_token, &done, &finish);
      EXPECT_EQ(got.reasoning, c.reasoning);
      EXPECT_EQ(got.content, c.content);
      EXPECT_EQ(done, c.done);
      EXPECT_EQ(finish.ok(), c.whole) << finish;
      if (!c.whole) {
        EXPECT_TRUE(absl::IsFailedPrecondition(finish)) << finish;
      }
      ASSERT_EQ(got.tool_calls.size(), c.calls.size());
      for (size_t i = 0; i < c.calls.size(); ++i) {
        EXPECT_EQ(got.tool_calls[i].index, static_cast<int>(i));
        EXPECT_EQ(got.tool_calls[i].id, absl::StrCat("call_", i));
        EXPECT_EQ(got.tool_calls[i].name, c.calls[i].first);
        if (c.whole || i + 1 < c.calls.size()) {
          EXPECT_EQ(json::parse(got.tool_calls[i].arguments, nullptr, false),
                    json::parse(c.calls[i].second))
              << got.tool_calls[i].arguments;
        } else {
          EXPECT_EQ(got.tool_calls[i].arguments, c.calls[i].second);
        }
      }
    }
  }
}

}  // namespace
}  // namespace k3
