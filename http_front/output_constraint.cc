#include "http_front/output_constraint.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/json_grammar.h"
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
      ++min_tokens_;
    }
    return *this;
  }
  // Free text; its budget is set later (SetBudget), once the shortest answer is known.
  Shape& FreeUntil(const char* name) {
    const std::optional<int32_t> id = tokenizer_.SpecialTokenId(name);
    if (id.has_value()) {
      alternative_->add_pieces()->set_free_until_token_id(*id);
      ++min_tokens_;
    }
    return *this;
  }
  Shape& Text(const std::string& text) {
    alternative_->add_pieces()->set_text(text);
    min_tokens_ += static_cast<int>(text.size());
    return *this;
  }
  // A JSON value of `schema`, compiled here so that a bad schema is the client's 400 naming
  // `param`.
  Shape& Json(const ordered_json& schema, bool strict, const char* param) {
    absl::StatusOr<std::shared_ptr<const JsonGrammar>> grammar =
        JsonGrammar::FromSchema(schema, strict);
    if (!grammar.ok()) {
      if (status_.ok()) status_ = ParamError(param, std::string(grammar.status().message()));
      return *this;
    }
    alternative_->add_pieces()->set_json_schema(schema.dump());
    min_tokens_ += (*grammar)->MinBytes();
    return *this;
  }
  // K3's tags.
  Shape& Open(const std::string& tag) { return Token(kK3Open).Text(tag).Token(kK3Sep); }
  Shape& Close(const std::string& tag) { return Token(kK3Close).Text(tag).Token(kK3Sep); }

  const absl::Status& status() const { return status_; }
  // The fewest tokens of an answer of this shape (with a byte-level vocabulary).
  int min_tokens() const { return min_tokens_; }

 private:
  const Tokenizer& tokenizer_;
  k3serve::v1::ConstraintAlternative* alternative_;
  absl::Status status_;
  int min_tokens_ = 0;
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

int ThinkingBudgetOf(const std::string& effort) {
  if (effort == "low") return 1024;
  if (effort == "medium") return 4096;
  if (effort == "high") return 16384;
  return 32768;
}

absl::StatusOr<std::optional<k3serve::v1::OutputConstraint>> OutputConstraintOf(
    const CompletionRequest& request, const Tokenizer& tokenizer, int max_tokens) {
  const bool call = request.tool_choice == "required" || request.tool_choice == "function";
  if (!call && request.chat.response_format.empty()) return std::nullopt;
  K3_ASSIGN_OR_RETURN(ChatFormat format, ChatFormatOf(tokenizer));
  k3serve::v1::OutputConstraint constraint;
  int shortest = INT_MAX;  // the fewest tokens of an answer, the thinking's close included
  auto add = [&](const ordered_json& schema, const std::string& function,
                 bool strict) -> absl::Status {
    Shape shape(tokenizer, constraint.add_alternatives());
    if (format == ChatFormat::kKimi) {
      if (!function.empty()) {
        shape.Token(kKimiToolCallsBegin).Token(kKimiToolCallBegin);
        shape.Text(absl::StrCat("functions.", function, ":0")).Token(kKimiToolCallArgumentBegin);
        shape.Json(schema, strict, "tools").Token(kKimiToolCallEnd).Token(kKimiToolCallsEnd);
      } else {
        shape.Json(schema, strict, "response_format");
      }
      shape.Token(kKimiEnd);
      shortest = std::min(shortest, shape.min_tokens());
      return shape.status();
    }
    K3Answer(shape, request);
    if (!function.empty()) {
      const std::string name = absl::StrReplaceAll(function, {{"&", "&amp;"}, {"\"", "&quot;"}});
      shape.Close("response").Open("tools").Open(absl::StrCat("call tool=\"", name, "\" index=\"1\""));
      shape.Open("json type=\"object\"").Json(schema, strict, "tools");
      shape.Close("json").Close("call").Close("tools");
    } else {
      shape.Json(schema, strict, "response_format").Close("response");
    }
    shape.Close("message").Token(kK3EndOfMessage);
    shortest = std::min(shortest, shape.min_tokens());
    return shape.status();
  };
  if (call) {
    for (const ordered_json* function : CallableFunctions(request)) {
      const ordered_json schema =
          function->contains("parameters") ? (*function)["parameters"] : ordered_json{{"type", "object"}};
      const auto strict_field = function->find("strict");
      const bool strict = strict_field != function->end() && strict_field->is_boolean() &&
                          strict_field->get<bool>();
      K3_RETURN_IF_ERROR(add(schema, (*function)["name"].get<std::string>(), strict));
    }
  } else {
    const ordered_json schema = request.chat.response_format == "json_schema"
                                    ? request.chat.response_schema
                                    : ordered_json{{"type", "object"}};
    K3_RETURN_IF_ERROR(add(schema, "", request.response_format_strict));
  }
  if (max_tokens > 0 && shortest > max_tokens) {
    return ParamError(request.max_tokens_param, absl::StrCat(request.max_tokens_param, " ", max_tokens,
                                                 " cannot hold the shortest answer of the requested "
                                                 "format (", shortest, " tokens)"));
  }
  if (format == ChatFormat::kKimi || !request.chat.thinking) return constraint;
  int budget;
  if (request.thinking_budget.has_value()) {
    budget = *request.thinking_budget;
    if (max_tokens > 0 && static_cast<int64_t>(budget) + shortest > max_tokens) {
      return ParamError(
          request.max_tokens_param,
          absl::StrCat(request.max_tokens_param, " ", max_tokens, " cannot hold thinking_budget ", budget,
                       " plus the shortest answer of the requested format (", shortest,
                       " tokens): raise max_tokens or lower thinking_budget"));
    }
  } else {
    budget = ThinkingBudgetOf(request.chat.thinking_effort);
    if (max_tokens > 0) budget = std::min(budget, (max_tokens - shortest) / 2);
  }
  for (k3serve::v1::ConstraintAlternative& alternative : *constraint.mutable_alternatives()) {
    for (k3serve::v1::ConstraintPiece& piece : *alternative.mutable_pieces()) {
      if (piece.has_free_until_token_id()) piece.set_max_free_tokens(budget);
    }
  }
  return constraint;
}

}  // namespace k3
