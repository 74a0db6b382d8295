#include "tokenizer/chat_template.h"

#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/template_json.h"

namespace k3 {
namespace {

using nlohmann::ordered_json;

// Appends ids to a rendering. Text is gathered until the next special token and encoded whole,
// as the template's string would be by the model's tokenizer; the first error sticks.
class Renderer {
 public:
  explicit Renderer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  void Special(const char* name) {
    FlushText();
    if (!status_.ok()) return;
    std::optional<int32_t> id = tokenizer_.SpecialTokenId(name);
    if (!id.has_value()) {
      status_ = absl::FailedPreconditionError(absl::StrCat("the tokenizer has no ", name));
      return;
    }
    ids_.push_back(*id);
  }

  void Text(std::string_view text) { text_.append(text); }

  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  absl::StatusOr<std::vector<int32_t>> Finish() {
    FlushText();
    if (!status_.ok()) return status_;
    return std::move(ids_);
  }

 private:
  void FlushText() {
    if (text_.empty() || !status_.ok()) return;
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(text_);
    text_.clear();
    if (!ids.ok()) {
      status_ = ids.status();
      return;
    }
    ids_.insert(ids_.end(), ids->begin(), ids->end());
  }

  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string text_;
  absl::Status status_;
};

using Attributes = std::vector<std::pair<std::string_view, std::string>>;

// <|open|>tag key="value"...<|sep|>, values with & and " escaped.
void OpenTag(Renderer& r, std::string_view tag, const Attributes& attributes = {}) {
  r.Special(kK3Open);
  std::string text(tag);
  for (const auto& [key, value] : attributes) {
    absl::StrAppend(&text, " ", Sv(key), "=\"",
                    absl::StrReplaceAll(Sv(value), {{"&", "&amp;"}, {"\"", "&quot;"}}), "\"");
  }
  r.Text(text);
  r.Special(kK3Sep);
}

void CloseTag(Renderer& r, std::string_view tag) {
  r.Special(kK3Close);
  r.Text(tag);
  r.Special(kK3Sep);
}

void K3Message(Renderer& r, const Attributes& attributes, std::string_view body) {
  OpenTag(r, "message", attributes);
  r.Text(body);
  CloseTag(r, "message");
  r.Special(kK3EndOfMessage);
}

// The body of the template's internal system messages (trimmed there; these have no blanks).
void K3SystemNotice(Renderer& r, std::string_view type, std::string_view body) {
  K3Message(r, {{"role", "system"}, {"type", std::string(type)}}, body);
}

// Python's str.strip(): whether a text is only whitespace (the template's `|trim` tests).
bool IsBlank(std::string_view text) {
  return absl::StripAsciiWhitespace(Sv(text)).empty();
}

std::string XtmlType(const ordered_json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_null()) return "null";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  return value.is_object() ? "object" : "array";
}

void K3ToolCall(Renderer& r, const ChatToolCall& call, int index) {
  OpenTag(r, "call", {{"tool", call.name}, {"index", absl::StrCat(index)}});
  ordered_json arguments = ordered_json::parse(call.arguments, nullptr, false);
  if (arguments.is_object()) {
    for (auto it = arguments.begin(); it != arguments.end(); ++it) {
      OpenTag(r, "argument", {{"key", it.key()}, {"type", XtmlType(it.value())}});
      r.Text(it->is_string() ? it->get<std::string>() : PythonJson(*it));
      CloseTag(r, "argument");
    }
  } else if (!IsBlank(call.arguments)) {
    OpenTag(r, "json", {{"type", "object"}});
    r.Text(call.arguments);
    CloseTag(r, "json");
  }
  CloseTag(r, "call");
}

void K3Assistant(Renderer& r, const ChatMessage& m, const ChatOptions& options) {
  Attributes attributes = {{"role", "assistant"}};
  if (!m.name.empty()) attributes.emplace_back("name", m.name);
  OpenTag(r, "message", attributes);
  if (options.thinking) {
    OpenTag(r, "think");
    if (!IsBlank(m.reasoning)) r.Text(m.reasoning);
    CloseTag(r, "think");
  }
  OpenTag(r, "response");
  r.Text(m.content);
  CloseTag(r, "response");
  if (!m.tool_calls.empty()) {
    OpenTag(r, "tools");
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      K3ToolCall(r, m.tool_calls[i], static_cast<int>(i) + 1);
    }
    CloseTag(r, "tools");
  }
  CloseTag(r, "message");
  r.Special(kK3EndOfMessage);
}

// A run of tool results after an assistant's calls. When every result names one of the calls by
// id they go in the calls' order under the calls' names; else in their own order, each named by
// its `name` or by the call at its position (the template's rule).
void K3ToolResults(Renderer& r, absl::Span<const ChatMessage> run,
                   absl::Span<const ChatToolCall> calls) {
  auto call_with_id = [&](const std::string& id) -> const ChatToolCall* {
    for (const ChatToolCall& call : calls) {
      if (!id.empty() && call.id == id) return &call;
    }
    return nullptr;
  };
  bool all_resolved = true;
  for (const ChatMessage& m : run) all_resolved = all_resolved && call_with_id(m.tool_call_id);
  int index = 0;
  auto emit = [&](const ChatMessage& m, const std::string& tool) {
    K3Message(r, {{"role", "tool"}, {"tool", tool}, {"index", absl::StrCat(++index)}}, m.content);
  };
  if (all_resolved) {
    std::vector<std::string> emitted;
    for (const ChatToolCall& call : calls) {
      if (call.id.empty() || absl::c_linear_search(emitted, call.id)) continue;
      emitted.push_back(call.id);
      for (const ChatMessage& m : run) {
        if (m.tool_call_id == call.id) emit(m, call.name);
      }
    }
    return;
  }
  for (const ChatMessage& m : run) {
    if (!m.name.empty()) {
      emit(m, m.name);
    } else if (index < static_cast<int>(calls.size())) {
      emit(m, calls[index].name);
    } else {
      return r.Fail(absl::InvalidArgumentError(
          "a tool message needs a tool_call_id of the assistant's tool_calls, or a name"));
    }
  }
}

void RenderK3(Renderer& r, absl::Span<const ChatMessage> messages, const ChatOptions& options) {
  if (options.tools.is_array() && !options.tools.empty()) {
    K3SystemNotice(r, "tool-declare",
                   absl::StrCat("# Tools\nHere are the available tools, described in JSONSchema."
                                "\n\n```json\n",
                                SortedTemplateJson(options.tools), "\n```"));
  }
  if (options.thinking && !options.thinking_effort.empty()) {
    K3SystemNotice(r, "thinking-effort",
                   absl::StrCat("`thinking_effort` guides on how much to think in your thinking "
                                "channel (not including the response channel), supported values "
                                "include `low`, `medium`, `high`, and `max`.\nNow the system is "
                                "invoked with `thinking_effort=",
                                options.thinking_effort, "`."));
  }
  absl::Span<const ChatToolCall> calls;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      K3Assistant(r, m, options);
      calls = m.tool_calls;
    } else if (m.role == "tool") {
      size_t end = i;
      while (end < messages.size() && messages[end].role == "tool") ++end;
      K3ToolResults(r, messages.subspan(i, end - i), calls);
      i = end - 1;
    } else {
      Attributes attributes = {{"role", m.role}};
      if (!m.name.empty()) attributes.emplace_back("name", m.name);
      K3Message(r, attributes, m.content);
    }
  }
  if (options.tool_choice == "required") {
    K3SystemNotice(r, "tool-choice",
                   "The system is invoked with `tool_choice=required`.\n"
                   "You MUST call tools in the next message.");
  } else if (options.tool_choice == "none") {
    K3SystemNotice(r, "tool-choice",
                   "The system is invoked with `tool_choice=none`.\n"
                   "You MUST NOT call any tools in the next message.");
  }
  constexpr char kRawJson[] =
      "\nYour response must be raw JSON data without markdown code blocks (```json) or any "
      "additional formatting.";
  if (options.response_format == "json_object") {
    K3SystemNotice(r, "response-format",
                   absl::StrCat("The system is invoked with `response_format=json_object`.",
                                kRawJson));
  } else if (options.response_format == "json_schema") {
    K3SystemNotice(r, "response-format",
                   absl::StrCat("The system is invoked with `response_format=json_schema`.",
                                kRawJson, "\nThe JSON data must match the following schema:\n```json\n",
                                SortedTemplateJson(options.response_schema), "\n```"));
  }
  if (options.add_generation_prompt) {
    OpenTag(r, "message", {{"role", "assistant"}});
    OpenTag(r, options.thinking ? "think" : "response");
  }
}

// Kimi K2's tool-call arguments: a JSON object as Python's json.dumps writes it, else as sent.
std::string KimiArguments(const std::string& arguments) {
  ordered_json parsed = ordered_json::parse(arguments, nullptr, false);
  return parsed.is_object() ? PythonJson(parsed) : arguments;
}

void RenderKimi(Renderer& r, absl::Span<const ChatMessage> messages, const ChatOptions& options) {
  auto open = [&](const std::string& role, const std::string& name) {
    r.Special(role == "user" ? kKimiUser : role == "assistant" ? kKimiAssistant : kKimiSystem);
    r.Text(name.empty() ? role : name);
    r.Special(kKimiMiddle);
  };
  if (options.tools.is_array() && !options.tools.empty()) {
    open("system", "tool_declare");
    r.Text(PythonJson(options.tools));
    r.Special(kKimiEnd);
  }
  std::vector<std::string> pending_ids;  // call ids whose results have not come yet, in order
  int call_counter = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && m.role != "system") {
      open("system", "");
      r.Text("You are Kimi, an AI assistant created by Moonshot AI.");
      r.Special(kKimiEnd);
      r.Text("\n");
    }
    open(m.role, m.name);
    if (m.role == "tool") {
      std::string id = absl::StrCat("functions.", m.name.empty() ? "unknown" : m.name, ":",
                                    call_counter);
      if (!pending_ids.empty()) {
        id = pending_ids.front();
        pending_ids.erase(pending_ids.begin());
      }
      r.Text(absl::StrCat("## Return of ", id, "\n", m.content));
    } else {
      r.Text(m.content);
    }
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      r.Special(kKimiToolCallsBegin);
      for (const ChatToolCall& call : m.tool_calls) {
        pending_ids.push_back(absl::StrCat("functions.", call.name, ":", call_counter++));
        r.Special(kKimiToolCallBegin);
        r.Text(pending_ids.back());
        r.Special(kKimiToolCallArgumentBegin);
        r.Text(KimiArguments(call.arguments));
        r.Special(kKimiToolCallEnd);
      }
      r.Special(kKimiToolCallsEnd);
    }
    r.Special(kKimiEnd);
  }
  if (options.add_generation_prompt) open("assistant", "");
}

bool HasAll(const Tokenizer& tokenizer, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (!tokenizer.SpecialTokenId(name).has_value()) return false;
  }
  return true;
}

absl::Status CheckInput(absl::Span<const ChatMessage> messages, const ChatOptions& options) {
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return absl::InvalidArgumentError(absl::StrCat("unknown chat role \"", Sv(m.role), "\""));
    }
  }
  const std::string& effort = options.thinking_effort;
  if (options.thinking && !effort.empty() && effort != "low" && effort != "medium" &&
      effort != "high" && effort != "max") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported thinking effort \"", Sv(effort), "\": low, medium, high or max"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatFormat> ChatFormatOf(const Tokenizer& tokenizer) {
  if (HasAll(tokenizer, {kK3Open, kK3Close, kK3Sep, kK3EndOfMessage})) return ChatFormat::kK3;
  if (HasAll(tokenizer, {kKimiSystem, kKimiUser, kKimiAssistant, kKimiMiddle, kKimiEnd})) {
    return ChatFormat::kKimi;
  }
  return absl::FailedPreconditionError(
      "the tokenizer has neither K3's chat tokens (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>) "
      "nor Kimi's (<|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|>, <|im_end|>)");
}

absl::StatusOr<int32_t> TurnEndId(const Tokenizer& tokenizer) {
  K3_ASSIGN_OR_RETURN(const ChatFormat format, ChatFormatOf(tokenizer));
  return *tokenizer.SpecialTokenId(format == ChatFormat::kK3 ? kK3EndOfMessage : kKimiEnd);
}

absl::StatusOr<std::vector<int32_t>> RenderChat(const Tokenizer& tokenizer,
                                                absl::Span<const ChatMessage> messages,
                                                const ChatOptions& options) {
  K3_RETURN_IF_ERROR(CheckInput(messages, options));
  K3_ASSIGN_OR_RETURN(const ChatFormat format, ChatFormatOf(tokenizer));
  Renderer renderer(tokenizer);
  if (format == ChatFormat::kK3) {
    RenderK3(renderer, messages, options);
  } else {
    RenderKimi(renderer, messages, options);
  }
  return renderer.Finish();
}

}  // namespace k3
