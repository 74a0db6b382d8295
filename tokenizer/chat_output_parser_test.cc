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

}  // namespace
}  // namespace k3
