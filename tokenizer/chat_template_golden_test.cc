// Chats rendered by RenderChat against the same chats rendered by the release's Jinja chat
// templates with Python's jinja2 (testdata/chat/make_chat_template_goldens.py), token for token:
// tools, tool calls, tool results, thinking and its effort, tool_choice and response_format, for
// K3 and Kimi K2. Each golden is an OpenAI request; it maps to the template's variables as the
// script's docstring says, and to ChatMessage / ChatOptions below the same way.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/chat_template.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

using json = nlohmann::ordered_json;  // the requests keep their key order

constexpr char kGoldens[] = "tokenizer/testdata/chat/chat_template_goldens.json";

Tokenizer Small(TokenizerFamily family) {
  auto tokenizer = RandomTokenizer(512, family);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *tokenizer;
}

std::vector<ChatMessage> Messages(const json& request) {
  std::vector<ChatMessage> messages;
  for (const json& m : request["messages"]) {
    ChatMessage message{.role = m["role"], .content = m.value("content", json("")).is_string()
                                                          ? m["content"].get<std::string>()
                                                          : "",
                        .reasoning = m.value("reasoning_content", ""),
                        .name = m.value("name", ""),
                        .tool_call_id = m.value("tool_call_id", "")};
    for (const json& call : m.value("tool_calls", json::array())) {
      message.tool_calls.push_back({.id = call["id"],
                                    .name = call["function"]["name"],
                                    .arguments = call["function"]["arguments"]});
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

ChatOptions Options(const json& request) {
  ChatOptions options;
  const json kwargs = request.value("chat_template_kwargs", json::object());
  options.thinking = kwargs.value("thinking", true);
  options.thinking_effort = request.value("reasoning_effort", kwargs.value("thinking_effort", "max"));
  options.tools = request.value("tools", json());
  if (request.contains("tool_choice")) options.tool_choice = request["tool_choice"];
  if (request.contains("response_format")) {
    options.response_format = request["response_format"]["type"];
    if (options.response_format == "json_schema") {
      options.response_schema = request["response_format"]["json_schema"]["schema"];
    }
  }
  return options;
}

TEST(ChatTemplateGoldenTest, RendersAsTheReleaseTemplate) {
  std::ifstream in(kGoldens);
  std::stringstream text;
  text << in.rdbuf();
  const json goldens = json::parse(text.str());
  ASSERT_GE(goldens.size(), 13u);
  const Tokenizer k3 = Small(TokenizerFamily::kK3);
  const Tokenizer kimi = Small(TokenizerFamily::kKimi);
  for (const json& golden : goldens) {
    SCOPED_TRACE(golden["name"].get<std::string>());
    const Tokenizer& t = golden["family"] == "k3" ? k3 : kimi;
    // The template's text holds special tokens by name; the message texts have none.
    absl::StatusOr<std::vector<int32_t>> expected =
        t.EncodeWithSpecialTokens(golden["rendered"].get<std::string>());
    ASSERT_TRUE(expected.ok());
    absl::StatusOr<std::vector<int32_t>> rendered =
        RenderChat(t, Messages(golden["request"]), Options(golden["request"]));
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered, *expected) << "decoded: " << *t.Decode(*rendered)
                                    << "\nexpected: " << golden["rendered"].get<std::string>();
  }
}

}  // namespace
}  // namespace k3
