#include "tokenizer/chat_output_parser.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/special_tokens.h"

namespace k3 {
namespace {

// A JSON string's body (no quotes) for `text`.
std::string JsonEscaped(std::string_view text) {
  std::string quoted = nlohmann::json(std::string(text)).dump(
      -1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

// The value of attribute `key` in a K3 tag header `tag key="value" ...`, unescaped.
std::string Attribute(std::string_view header, std::string_view key) {
  const std::string needle = absl::StrCat(" ", Sv(key), "=\"");
  const size_t start = header.find(needle);
  if (start == std::string_view::npos) return "";
  const size_t begin = start + needle.size();
  const size_t end = header.find('"', begin);
  const std::string_view value =
      header.substr(begin, end == std::string_view::npos ? end : end - begin);
  return absl::StrReplaceAll(Sv(value), {{"&quot;", "\""}, {"&amp;", "&"}});
}

}  // namespace

void ChatDelta::Append(const ChatDelta& next) {
  reasoning += next.reasoning;
  content += next.content;
  for (const ToolCallDelta& call : next.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == call.index) {
      tool_calls.back().arguments += call.arguments;
    } else {
      tool_calls.push_back(call);
    }
  }
}

ChatOutputParser::ChatOutputParser(ChatFormat format, bool thinking, std::string call_id_prefix)
    : format_(format),
      call_id_prefix_(std::move(call_id_prefix)),
      mode_(format == ChatFormat::kK3 && thinking ? Mode::kReasoning : Mode::kContent) {}

void ChatOutputParser::Special(std::string_view name, ChatDelta* delta) {
  if (mode_ == Mode::kDone) return;
  if (format_ == ChatFormat::kK3) {
    K3Special(name, delta);
  } else {
    KimiSpecial(name, delta);
  }
}

void ChatOutputParser::Text(std::string_view text, ChatDelta* delta) {
  if (tag_ != Tag::kNone || mode_ == Mode::kCallHeader) {
    header_.append(text);
    return;
  }
  switch (mode_) {
    case Mode::kReasoning:
      delta->reasoning.append(text);
      break;
    case Mode::kContent:
      delta->content.append(text);
      break;
    case Mode::kArgument:
      Arguments(delta).arguments += string_value_ ? JsonEscaped(text) : std::string(text);
      break;
    case Mode::kJson:
      Arguments(delta).arguments.append(text);
      break;
    default:  // between sections: the format has no text there
      break;
  }
}

void ChatOutputParser::K3Special(std::string_view name, ChatDelta* delta) {
  if (name == kK3Open || name == kK3Close) {
    tag_ = name == kK3Open ? Tag::kOpen : Tag::kClose;
    header_.clear();
  } else if (name == kK3Sep && tag_ != Tag::kNone) {
    const Tag tag = std::exchange(tag_, Tag::kNone);
    const std::string header = std::move(header_);
    header_.clear();
    if (tag == Tag::kOpen) {
      K3Open(header, delta);
    } else {
      K3Close(header, delta);
    }
  } else if (name == kK3EndOfMessage) {
    mode_ = Mode::kDone;
  }
}

void ChatOutputParser::K3Open(std::string_view header, ChatDelta* delta) {
  const std::string_view tag = header.substr(0, header.find(' '));
  if (tag == "think") {
    mode_ = Mode::kReasoning;
  } else if (tag == "response") {
    mode_ = Mode::kContent;
  } else if (tag == "call") {
    StartCall(Attribute(header, "tool"), "", delta);
    mode_ = Mode::kCall;
    arguments_ = 0;
  } else if (tag == "argument" && (mode_ == Mode::kCall || mode_ == Mode::kArgument)) {
    string_value_ = Attribute(header, "type") == "string";
    Arguments(delta).arguments +=
        absl::StrCat(arguments_++ == 0 ? "{" : ", ", "\"", JsonEscaped(Attribute(header, "key")),
                     "\": ", string_value_ ? "\"" : "");
    mode_ = Mode::kArgument;
  } else if (tag == "json" && mode_ == Mode::kCall) {
    arguments_ = -1;  // the block is the whole arguments
    mode_ = Mode::kJson;
  } else {
    mode_ = Mode::kBetween;  // tools, or a tag this parser does not know: no text of its own
  }
}

void ChatOutputParser::K3Close(std::string_view tag, ChatDelta* delta) {
  if (tag == "think") {
    mode_ = Mode::kContent;  // a response follows; text before its tag is still the answer
  } else if (tag == "argument" && mode_ == Mode::kArgument) {
    if (string_value_) Arguments(delta).arguments += "\"";
    mode_ = Mode::kCall;
  } else if (tag == "json" && mode_ == Mode::kJson) {
    mode_ = Mode::kCall;
  } else if (tag == "call" && calls_ > 0) {
    if (arguments_ > 0) Arguments(delta).arguments += "}";
    if (arguments_ == 0) Arguments(delta).arguments += "{}";
    mode_ = Mode::kBetween;
  } else if (tag == "message") {
    mode_ = Mode::kDone;
  } else {
    mode_ = Mode::kBetween;
  }
}

absl::Status ChatOutputParser::Finish(ChatDelta* delta) {
  if (mode_ == Mode::kCall && tag_ == Tag::kNone && format_ == ChatFormat::kK3) {
    K3Close("call", delta);
    return absl::OkStatus();
  }
  const bool in_call = mode_ == Mode::kCall || mode_ == Mode::kArgument || mode_ == Mode::kJson ||
                       mode_ == Mode::kCallHeader;
  if (!in_call) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the answer ended inside tool call ", calls_ - 1, ": its arguments are not whole"));
}

void ChatOutputParser::KimiSpecial(std::string_view name, ChatDelta* delta) {
  if (name == kKimiToolCallBegin) {
    header_.clear();
    mode_ = Mode::kCallHeader;
  } else if (name == kKimiToolCallArgumentBegin && mode_ == Mode::kCallHeader) {
    // The id reads functions.NAME:INDEX.
    std::string_view id = header_;
    std::string_view fn = id;
    if (fn.substr(0, 10) == "functions.") fn.remove_prefix(10);
    fn = fn.substr(0, fn.rfind(':'));
    StartCall(std::string(fn), std::string(id), delta);
    header_.clear();
    mode_ = Mode::kJson;
  } else if (name == kKimiToolCallEnd || name == kKimiToolCallsBegin ||
             name == kKimiToolCallsEnd) {
    mode_ = Mode::kBetween;
  } else if (name == kKimiEnd) {
    mode_ = Mode::kDone;
  }
}

ToolCallDelta& ChatOutputParser::StartCall(std::string name, std::string id, ChatDelta* delta) {
  const int index = calls_++;
  delta->tool_calls.push_back({.index = index,
                               .id = id.empty() ? absl::StrCat(call_id_prefix_, index) : id,
                               .name = std::move(name)});
  return delta->tool_calls.back();
}

ToolCallDelta& ChatOutputParser::Arguments(ChatDelta* delta) {
  if (delta->tool_calls.empty() || delta->tool_calls.back().index != calls_ - 1) {
    delta->tool_calls.push_back({.index = calls_ - 1});
  }
  return delta->tool_calls.back();
}

}  // namespace k3
