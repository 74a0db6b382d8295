#include "tokenizer/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "model/status_macros.h"
#include "tokenizer/special_tokens.h"

namespace k3 {
namespace {

// Appends ids to a rendering; the first error sticks and is returned by Finish.
class Renderer {
 public:
  explicit Renderer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  void Special(const char* name) {
    if (!status_.ok()) return;
    std::optional<int32_t> id = tokenizer_.SpecialTokenId(name);
    if (!id.has_value()) {
      status_ = absl::FailedPreconditionError(absl::StrCat("the tokenizer has no ", name));
      return;
    }
    ids_.push_back(*id);
  }

  void Text(std::string_view text) {
    if (!status_.ok()) return;
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(text);
    if (!ids.ok()) {
      status_ = ids.status();
      return;
    }
    ids_.insert(ids_.end(), ids->begin(), ids->end());
  }

  absl::StatusOr<std::vector<int32_t>> Finish() {
    if (!status_.ok()) return status_;
    return std::move(ids_);
  }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  absl::Status status_;
};

// <|open|>tag key="value"<|sep|>, the value with & and " escaped.
void OpenTag(Renderer& r, std::string_view tag, std::string_view key = {},
             std::string_view value = {}) {
  r.Special(kK3Open);
  std::string text(tag);
  if (!key.empty()) {
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

void RenderK3(Renderer& r, absl::Span<const ChatMessage> messages, const ChatOptions& options) {
  for (const ChatMessage& m : messages) {
    OpenTag(r, "message", "role", m.role);
    if (m.role == "assistant") {
      if (!m.reasoning.empty()) {
        OpenTag(r, "think");
        r.Text(m.reasoning);
        CloseTag(r, "think");
      }
      OpenTag(r, "response");
      r.Text(m.content);
      CloseTag(r, "response");
    } else {
      r.Text(m.content);
    }
    CloseTag(r, "message");
    r.Special(kK3EndOfMessage);
  }
  if (options.add_generation_prompt) {
    OpenTag(r, "message", "role", "assistant");
    OpenTag(r, options.thinking ? "think" : "response");
  }
}

void RenderKimi(Renderer& r, absl::Span<const ChatMessage> messages, const ChatOptions& options) {
  auto open = [&](const std::string& role) {
    r.Special(role == "system" ? kKimiSystem : role == "user" ? kKimiUser : kKimiAssistant);
    r.Text(role);
    r.Special(kKimiMiddle);
  };
  for (const ChatMessage& m : messages) {
    open(m.role);
    r.Text(m.content);
    r.Special(kKimiEnd);
  }
  if (options.add_generation_prompt) open("assistant");
}

bool HasAll(const Tokenizer& tokenizer, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (!tokenizer.SpecialTokenId(name).has_value()) return false;
  }
  return true;
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
  for (const ChatMessage& m : messages) {
    if (m.role == "tool") {
      return absl::UnimplementedError("tool messages are not rendered yet");
    }
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("unknown chat role \"", Sv(m.role), "\""));
    }
  }
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
