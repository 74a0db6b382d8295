#include "http_front/output_constraint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/special_tokens.h"

namespace k3 {
namespace {

using nlohmann::ordered_json;

// Appends pieces to one alternative; a missing special token sticks as the error.
class Shape {
 public:
  Shape(const Tokenizer& tokenizer, k3serve::v1::ConstraintAlternative* alternative)
      : tokenizer_(tokenizer), alternative_(alternative) {}

  Shape& Token(const char* name) {
    const std::optional<int32_t> id = tokenizer_.SpecialTokenId(name);
    if (!id.has_value()) {
      status_ = absl::FailedPreconditionError(absl::StrCat("the tokenizer has no ", name));
    } else {
      alternative_->add_pieces()->set_token_id(*id);
    }
    return *this;
  }
  Shape& FreeUntil(const char* name) {
    const std::optional<int32_t> id = tokenizer_.SpecialTokenId(name);
    if (id.has_value()) alternative_->add_pieces()->set_free_until_token_id(*id);
    return *this;
  }
  Shape& Text(const std::string& text) {
    alternative_->add_pieces()->set_text(text);
    return *this;
  }
  Shape& Json(const ordered_json& schema) {
    alternative_->add_pieces()->set_json_schema(schema.dump());
    return *this;
  }
  // K3's tags.
  Shape& Open(const std::string& tag) { return Token(kK3Open).Text(tag).Token(kK3Sep); }
  Shape& Close(const std::string& tag) { return Token(kK3Close).Text(tag).Token(kK3Sep); }

  const absl::Status& status() const { return status_; }

 private:
  const Tokenizer& tokenizer_;
  k3serve::v1::ConstraintAlternative* alternative_;
  absl::Status status_;
};

// The tools a call may use: all for "required", the named one for a function.
std::vector<const ordered_json*> CallableFunctions(const CompletionRequest& request) {
  std::vector<const ordered_json*> functions;
  for (const ordered_json& tool : request.chat.tools) {
    const ordered_json& function = tool["function"];
    if (request.tool_choice == "required" ||
        function["name"].get<std::string>() == request.tool_choice_function) {
      functions.push_back(&function);
    }
  }
  return functions;
}

void K3Answer(Shape& shape, const CompletionRequest& request) {
  if (request.chat.thinking) {
    shape.FreeUntil(kK3Close).Text("think").Token(kK3Sep).Open("response");
  }
}

}  // namespace

absl::StatusOr<std::optional<k3serve::v1::OutputConstraint>> OutputConstraintOf(
    const CompletionRequest& request, const Tokenizer& tokenizer) {
  const bool call = request.tool_choice == "required" || request.tool_choice == "function";
  if (!call && request.chat.response_format.empty()) return std::nullopt;
  K3_ASSIGN_OR_RETURN(ChatFormat format, ChatFormatOf(tokenizer));
  k3serve::v1::OutputConstraint constraint;
  auto add = [&](const ordered_json& schema, const std::string& function) -> absl::Status {
    Shape shape(tokenizer, constraint.add_alternatives());
    if (format == ChatFormat::kKimi) {
      if (!function.empty()) {
        shape.Token(kKimiToolCallsBegin).Token(kKimiToolCallBegin);
        shape.Text(absl::StrCat("functions.", function, ":0")).Token(kKimiToolCallArgumentBegin);
        shape.Json(schema).Token(kKimiToolCallEnd).Token(kKimiToolCallsEnd);
      } else {
        shape.Json(schema);
      }
      shape.Token(kKimiEnd);
      return shape.status();
    }
    K3Answer(shape, request);
    if (!function.empty()) {
      const std::string name = absl::StrReplaceAll(function, {{"&", "&amp;"}, {"\"", "&quot;"}});
      shape.Close("response").Open("tools").Open(absl::StrCat("call tool=\"", name, "\" index=\"1\""));
      shape.Open("json type=\"object\"").Json(schema).Close("json").Close("call").Close("tools");
    } else {
      shape.Json(schema).Close("response");
    }
    shape.Close("message").Token(kK3EndOfMessage);
    return shape.status();
  };
  if (call) {
    for (const ordered_json* function : CallableFunctions(request)) {
      const ordered_json schema =
          function->contains("parameters") ? (*function)["parameters"] : ordered_json{{"type", "object"}};
      K3_RETURN_IF_ERROR(add(schema, (*function)["name"].get<std::string>()));
    }
  } else {
    const ordered_json schema = request.chat.response_format == "json_schema"
                                    ? request.chat.response_schema
                                    : ordered_json{{"type", "object"}};
    K3_RETURN_IF_ERROR(add(schema, ""));
  }
  return constraint;
}

}  // namespace k3
