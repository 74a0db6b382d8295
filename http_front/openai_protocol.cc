#include "http_front/openai_protocol.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

// Ordered: `tools` keep the client's key order (Kimi's template writes them as they came).
using json = nlohmann::ordered_json;

constexpr char kParamPayload[] = "type.k3serve/openai.param";
constexpr int kMaxStops = 4;  // OpenAI's limit

absl::Status BadParam(const std::string& param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

// The field `name` of `body` if present and not null.
const json* Field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::optional<double>> Number(const json& body, const char* name, double min,
                                             double max) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) return BadParam(name, absl::StrCat("'", name, "' must be a number"));
  const double number = value->get<double>();
  if (!(number >= min && number <= max)) {
    return BadParam(name, absl::StrCat("'", name, "' must be in [", min, ", ", max, "]"));
  }
  return number;
}

absl::StatusOr<std::optional<int64_t>> Integer(const json& body, const char* name, int64_t min,
                                               int64_t max) {
  const json* value = Field(body, name);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number_integer()) {
    return BadParam(name, absl::StrCat("'", name, "' must be an integer"));
  }
  // nlohmann-json parses non-negative integers as unsigned: compare those as unsigned.
  const bool in_range = value->is_number_unsigned()
                            ? value->get<uint64_t>() <= static_cast<uint64_t>(max) &&
                                  (min <= 0 || value->get<uint64_t>() >= static_cast<uint64_t>(min))
                            : value->get<int64_t>() >= min && value->get<int64_t>() <= max;
  if (!in_range) {
    return BadParam(name, absl::StrCat("'", name, "' must be in [", min, ", ", max, "]"));
  }
  return value->get<int64_t>();
}

absl::StatusOr<bool> Bool(const json& body, const char* name) {
  const json* value = Field(body, name);
  if (value == nullptr) return false;
  if (!value->is_boolean()) return BadParam(name, absl::StrCat("'", name, "' must be a boolean"));
  return value->get<bool>();
}

absl::Status ParsePrompt(const json& body, CompletionRequest* request) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return BadParam("prompt", "'prompt' is required");
  // A batch of one prompt is that prompt.
  if (prompt->is_array() && prompt->size() == 1 &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    prompt = &(*prompt)[0];
  }
  if (prompt->is_string()) {
    request->prompt_text = prompt->get<std::string>();
    if (request->prompt_text->empty()) return BadParam("prompt", "'prompt' is empty");
    return absl::OkStatus();
  }
  if (!prompt->is_array() || prompt->empty()) {
    return BadParam("prompt",
                    "'prompt' must be a non-empty string or array of token ids "
                    "(one prompt per request)");
  }
  for (const json& id : *prompt) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return BadParam("prompt",
                      "'prompt' must be a string or an array of token ids (one prompt "
                      "per request)");
    }
    request->prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// OpenAI's `developer` messages are what older models call `system` ones.
std::string CanonicalRole(std::string role) { return role == "developer" ? "system" : role; }

// A string field of a message, or empty.
absl::StatusOr<std::string> MessageString(const json& m, const char* name) {
  const json* value = Field(m, name);
  if (value == nullptr) return std::string();
  if (!value->is_string()) {
    return BadParam("messages", absl::StrCat("a message's '", name, "' must be a string"));
  }
  return value->get<std::string>();
}

// The fields of tool calling and reasoning: name, reasoning_content, tool_calls, tool_call_id.
absl::Status ParseAgentMessageFields(const json& m, ChatMessage* message) {
  absl::StatusOr<std::string> name = MessageString(m, "name");
  absl::StatusOr<std::string> reasoning = MessageString(m, "reasoning_content");
  absl::StatusOr<std::string> call_id = MessageString(m, "tool_call_id");
  for (const auto* s : {&name, &reasoning, &call_id}) {
    if (!s->ok()) return s->status();
  }
  message->name = *name;
  message->reasoning = *reasoning;
  message->tool_call_id = *call_id;
  const json* calls = Field(m, "tool_calls");
  if (calls == nullptr) return absl::OkStatus();
  if (!calls->is_array() || message->role != "assistant") {
    return BadParam("messages", "'tool_calls' must be an array, on an assistant message");
  }
  for (const json& call : *calls) {
    const json* function = call.is_object() ? Field(call, "function") : nullptr;
    const json* fn_name = function != nullptr && function->is_object() ? Field(*function, "name")
                                                                        : nullptr;
    if (fn_name == nullptr || !fn_name->is_string()) {
      return BadParam("messages", "every tool call needs a 'function' with a string 'name'");
    }
    ChatToolCall parsed{.name = fn_name->get<std::string>()};
    if (const json* id = Field(call, "id"); id != nullptr && id->is_string()) {
      parsed.id = id->get<std::string>();
    }
    if (const json* arguments = Field(*function, "arguments")) {
      // OpenAI sends a JSON string; an object is taken as that JSON.
      parsed.arguments = arguments->is_string() ? arguments->get<std::string>() : arguments->dump();
    }
    message->tool_calls.push_back(std::move(parsed));
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& body, CompletionRequest* request) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return BadParam("messages", "'messages' must be a non-empty array");
  }
  for (const json& m : *messages) {
    const json* role = m.is_object() ? Field(m, "role") : nullptr;
    if (role == nullptr || !role->is_string()) {
      return BadParam("messages", "every message needs a string 'role'");
    }
    ChatMessage message{.role = CanonicalRole(role->get<std::string>())};
    const json* content = Field(m, "content");
    if (content == nullptr) {
      // An assistant message may have no content (OpenAI: tool calls only).
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        const json* type = part.is_object() ? Field(part, "type") : nullptr;
        const json* text = part.is_object() ? Field(part, "text") : nullptr;
        if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
          return BadParam("messages", "only text content parts are supported");
        }
        message.content += text->get<std::string>();
      }
    } else {
      return BadParam("messages", "a message's 'content' must be a string or an array of parts");
    }
    K3_RETURN_IF_ERROR(ParseAgentMessageFields(m, &message));
    request->messages.push_back(std::move(message));
  }
  // A tool message answers a call the conversation made (OpenAI answers 400 otherwise): its
  // result would otherwise be rendered against a call the model never saw.
  std::vector<std::string> call_ids;
  for (size_t i = 0; i < request->messages.size(); ++i) {
    const ChatMessage& message = request->messages[i];
    for (const ChatToolCall& call : message.tool_calls) call_ids.push_back(call.id);
    if (message.role != "tool") continue;
    if (message.tool_call_id.empty()) {
      return BadParam("messages", absl::StrCat("messages[", i, "]: a tool message needs the "
                                               "'tool_call_id' of the call it answers"));
    }
    if (absl::c_find(call_ids, message.tool_call_id) == call_ids.end()) {
      return BadParam("messages",
                      absl::StrCat("messages[", i, "]: 'tool_call_id' '", message.tool_call_id,
                                   "' answers no tool call of an earlier assistant message"));
    }
  }
  return absl::OkStatus();
}

// Fields of OpenAI's API this server does not implement: a value that asks for their effect is
// a 400 naming the field (ignoring it would answer another question than the one asked); their
// neutral values pass. Ranges are OpenAI's.
absl::Status RefuseUnimplemented(const json& body, Endpoint endpoint) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    K3_ASSIGN_OR_RETURN(std::optional<double> penalty, Number(body, name, -2, 2));
    if (penalty.value_or(0) != 0) {
      return BadParam(name, absl::StrCat("'", name, "' is not supported (only 0)"));
    }
  }
  if (const json* bias = Field(body, "logit_bias")) {
    if (!bias->is_object()) return BadParam("logit_bias", "'logit_bias' must be an object");
    for (const auto& [token, value] : bias->items()) {
      if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
        return BadParam("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      }
    }
    if (!bias->empty()) return BadParam("logit_bias", "'logit_bias' is not supported");
  }
  if (endpoint == Endpoint::kCompletions) {
    K3_ASSIGN_OR_RETURN(bool echo, Bool(body, "echo"));
    if (echo) return BadParam("echo", "'echo' is not supported (only false)");
    if (const json* suffix = Field(body, "suffix")) {
      if (!suffix->is_string()) return BadParam("suffix", "'suffix' must be a string");
      if (!suffix->get<std::string>().empty()) {
        return BadParam("suffix", "'suffix' is not supported (insertion is not implemented)");
      }
    }
    K3_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, Integer(body, "best_of", 1, 20));
    if (best_of.value_or(1) != 1) return BadParam("best_of", "'best_of' is not supported (only 1)");
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, CompletionRequest* request) {
  const json* stop = Field(body, "stop");
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    request->stop.push_back(stop->get<std::string>());
  } else if (stop->is_array() && stop->size() <= kMaxStops) {
    for (const json& s : *stop) {
      if (!s.is_string()) return BadParam("stop", "'stop' must be a string or array of strings");
      request->stop.push_back(s.get<std::string>());
    }
  } else {
    return BadParam("stop", absl::StrCat("'stop' must be a string or an array of at most ",
                                         kMaxStops, " strings"));
  }
  for (const std::string& s : request->stop) {
    if (s.empty()) return BadParam("stop", "'stop' strings must not be empty");
  }
  return absl::OkStatus();
}

// n, logprobs and top_logprobs (the two endpoints name them differently), skip_special_tokens.
absl::Status ParseChoicesAndLogprobs(const json& body, Endpoint endpoint,
                                     CompletionRequest* request) {
  K3_ASSIGN_OR_RETURN(std::optional<int64_t> n, Integer(body, "n", 1, kMaxChoices));
  request->n = static_cast<int>(n.value_or(1));
  if (endpoint == Endpoint::kCompletions) {
    K3_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, Integer(body, "logprobs", 0, 5));
    if (logprobs.has_value()) request->top_logprobs = static_cast<int>(*logprobs);
  } else {
    K3_ASSIGN_OR_RETURN(bool logprobs, Bool(body, "logprobs"));
    K3_ASSIGN_OR_RETURN(std::optional<int64_t> top, Integer(body, "top_logprobs", 0, 20));
    if (top.has_value() && !logprobs) {
      return BadParam("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    if (logprobs) request->top_logprobs = static_cast<int>(top.value_or(0));
  }
  if (Field(body, "skip_special_tokens") != nullptr) {
    K3_ASSIGN_OR_RETURN(bool skip, Bool(body, "skip_special_tokens"));
    request->skip_special_tokens = skip;
  }
  return absl::OkStatus();
}

// reasoning_effort, or chat_template_kwargs' thinking (enable_thinking) and thinking_effort.
absl::Status ParseThinking(const json& body, CompletionRequest* request) {
  if (const json* effort = Field(body, "reasoning_effort")) {
    if (!effort->is_string()) return BadParam("reasoning_effort", "must be a string");
    request->chat.thinking_effort = effort->get<std::string>();
    // OpenAI's names for the ends of the range.
    if (request->chat.thinking_effort == "none") request->chat.thinking = false;
    if (request->chat.thinking_effort == "minimal") request->chat.thinking_effort = "low";
  }
  if (const json* kwargs = Field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return BadParam("chat_template_kwargs", "must be an object");
    for (const char* name : {"thinking", "enable_thinking"}) {
      if (const json* thinking = Field(*kwargs, name)) {
        if (!thinking->is_boolean()) {
          return BadParam("chat_template_kwargs", absl::StrCat("'", name, "' must be a boolean"));
        }
        request->chat.thinking = thinking->get<bool>();
      }
    }
    if (const json* effort = Field(*kwargs, "thinking_effort")) {
      if (!effort->is_string()) {
        return BadParam("chat_template_kwargs", "'thinking_effort' must be a string");
      }
      request->chat.thinking_effort = effort->get<std::string>();
    }
  }
  K3_ASSIGN_OR_RETURN(std::optional<int64_t> budget,
                      Integer(body, "thinking_budget", 0, INT32_MAX));
  if (budget.has_value()) request->thinking_budget = static_cast<int>(*budget);
  const std::string& effort = request->chat.thinking_effort;
  if (request->chat.thinking && effort != "low" && effort != "medium" && effort != "high" &&
      effort != "max") {
    return BadParam("reasoning_effort", absl::StrCat("unsupported reasoning effort '", effort,
                                                     "': none, minimal, low, medium, high, max"));
  }
  return absl::OkStatus();
}

// tools (functions with names) and tool_choice.
absl::Status ParseTools(const json& body, CompletionRequest* request) {
  std::vector<std::string> names;
  if (const json* tools = Field(body, "tools")) {
    if (!tools->is_array()) return BadParam("tools", "'tools' must be an array");
    for (const json& tool : *tools) {
      const json* function = tool.is_object() ? Field(tool, "function") : nullptr;
      const json* name = function != nullptr && function->is_object() ? Field(*function, "name")
                                                                       : nullptr;
      if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
        return BadParam("tools", "every tool needs a 'function' with a non-empty 'name'");
      }
      names.push_back(name->get<std::string>());
    }
    request->chat.tools = *tools;
  }
  request->tool_choice = names.empty() ? "none" : "auto";
  const json* choice = Field(body, "tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string() && (*choice == "none" || *choice == "auto" || *choice == "required")) {
    request->tool_choice = choice->get<std::string>();
    request->chat.tool_choice = request->tool_choice;
  } else if (const json* function = choice->is_object() ? Field(*choice, "function") : nullptr;
             function != nullptr && function->is_object() && Field(*function, "name") != nullptr &&
             Field(*function, "name")->is_string()) {
    request->tool_choice = "function";
    request->tool_choice_function = Field(*function, "name")->get<std::string>();
  } else {
    return BadParam("tool_choice",
                    "'tool_choice' must be none, auto, required or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (request->tool_choice != "none" && request->tool_choice != "auto" &&
      (names.empty() || (request->tool_choice == "function" &&
                         absl::c_find(names, request->tool_choice_function) == names.end()))) {
    return BadParam("tool_choice", "'tool_choice' asks for a tool that 'tools' does not declare");
  }
  return absl::OkStatus();
}

// response_format: text, json_object, or json_schema with its schema.
absl::Status ParseResponseFormat(const json& body, CompletionRequest* request) {
  const json* format = Field(body, "response_format");
  if (format == nullptr) return absl::OkStatus();
  const json* type = format->is_object() ? Field(*format, "type") : nullptr;
  if (type == nullptr || !type->is_string() ||
      (*type != "text" && *type != "json_object" && *type != "json_schema")) {
    return BadParam("response_format", "'response_format.type' must be text, json_object or "
                                       "json_schema");
  }
  if (*type == "text") return absl::OkStatus();
  request->chat.response_format = type->get<std::string>();
  if (*type == "json_schema") {
    const json* wrapper = Field(*format, "json_schema");
    const json* schema = wrapper != nullptr && wrapper->is_object() ? Field(*wrapper, "schema")
                                                                     : nullptr;
    if (schema == nullptr || !schema->is_object()) {
      return BadParam("response_format", "'response_format.json_schema.schema' must be an object");
    }
    request->chat.response_schema = *schema;
    if (const json* strict = Field(*wrapper, "strict")) {
      if (!strict->is_boolean()) {
        return BadParam("response_format", "'response_format.json_schema.strict' must be a boolean");
      }
      request->response_format_strict = strict->get<bool>();
    }
  }
  return absl::OkStatus();
}

absl::Status Parse(const json& body, Endpoint endpoint, CompletionRequest* request) {
  if (!body.is_object()) return BadParam("", "the request body must be a JSON object");
  if (const json* model = Field(body, "model")) {
    if (!model->is_string()) return BadParam("model", "'model' must be a string");
    request->model = model->get<std::string>();
  }
  absl::Status status = endpoint == Endpoint::kChatCompletions ? ParseMessages(body, request)
                                                               : ParsePrompt(body, request);
  if (!status.ok()) return status;
  if (status = ParseChoicesAndLogprobs(body, endpoint, request); !status.ok()) return status;
  if (status = RefuseUnimplemented(body, endpoint); !status.ok()) return status;
  // Chat's newer name for max_tokens wins where both are given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    K3_ASSIGN_OR_RETURN(std::optional<int64_t> max, Integer(body, name, 1, INT32_MAX));
    if (max.has_value()) {
      request->max_tokens = static_cast<int>(*max);
      request->max_tokens_param = name;
    }
  }
  K3_ASSIGN_OR_RETURN(std::optional<double> temperature, Number(body, "temperature", 0, 2));
  if (temperature.has_value()) request->temperature = static_cast<float>(*temperature);
  K3_ASSIGN_OR_RETURN(std::optional<double> top_p, Number(body, "top_p", 0, 1));
  if (top_p.has_value()) {
    if (*top_p <= 0) return BadParam("top_p", "'top_p' must be in (0, 1]");
    request->top_p = static_cast<float>(*top_p);
  }
  if (const json* seed = Field(body, "seed")) {
    if (!seed->is_number_integer()) return BadParam("seed", "'seed' must be an integer");
    request->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                               : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (status = ParseStop(body, request); !status.ok()) return status;
  if (endpoint == Endpoint::kChatCompletions) {
    if (status = ParseThinking(body, request); !status.ok()) return status;
    if (status = ParseTools(body, request); !status.ok()) return status;
    if (status = ParseResponseFormat(body, request); !status.ok()) return status;
  }
  K3_ASSIGN_OR_RETURN(bool stream, Bool(body, "stream"));
  request->stream = stream;
  if (const json* options = Field(body, "stream_options")) {
    if (!options->is_object()) return BadParam("stream_options", "must be an object");
    absl::StatusOr<bool> usage = Bool(*options, "include_usage");
    if (!usage.ok()) return BadParam("stream_options", std::string(usage.status().message()));
    request->include_usage = *usage;
  }
  return absl::OkStatus();
}

json UsageJson(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json HeadJson(const ResponseHead& head, bool chunk) {
  const bool chat = head.endpoint == Endpoint::kChatCompletions;
  return {
      {"id", head.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", head.created},
      {"model", head.model}};
}

json BytesJson(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(c);
  return bytes;
}

// A log-probability as a JSON number with the fewest digits that give back the float exactly (at
// most 9 significant ones: std::to_chars' shortest form), so that a client reading it as a double
// and rounding to float (Math.fround) has the very bits the sampler saw: two runs' logprobs compare
// bit for bit (batch invariance, issue 39). Widening the float to a double instead would print 17
// digits of the widened value. Non-finite values stay as they are (nlohmann writes null).
json LogprobJson(float logprob) {
  if (!std::isfinite(logprob)) return logprob;
  char digits[32];
  const std::to_chars_result end =
      std::to_chars(digits, digits + sizeof(digits), logprob, std::chars_format::scientific);
  *end.ptr = '\0';
  return std::strtod(digits, nullptr);
}

// A choice's `logprobs`: chat's {"content": [{token, logprob, bytes, top_logprobs}]}, or the
// completions API's {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
json LogprobsJson(Endpoint endpoint, const std::optional<std::vector<TokenLogprob>>& logprobs) {
  if (!logprobs.has_value()) return nullptr;
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const TokenLogprob& t : *logprobs) {
      json top = json::array();
      for (const auto& [token, logprob] : t.top) {
        top.push_back(
            {{"token", token}, {"logprob", LogprobJson(logprob)}, {"bytes", BytesJson(token)}});
      }
      content.push_back({{"token", t.token},
                         {"logprob", LogprobJson(t.logprob)},
                         {"bytes", BytesJson(t.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (const TokenLogprob& t : *logprobs) {
    tokens.push_back(t.token);
    token_logprobs.push_back(LogprobJson(t.logprob));
    json top = json::object();
    for (const auto& [token, logprob] : t.top) top[token] = LogprobJson(logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// OpenAI's tool_calls: whole calls, or a stream's pieces (indexed; id, type and name in a call's
// first piece only).
json ToolCallsJson(const std::vector<ToolCallDelta>& calls, bool delta) {
  json out = json::array();
  for (const ToolCallDelta& call : calls) {
    json piece = delta ? json{{"index", call.index}} : json::object();
    json function = json::object();
    if (!delta || !call.id.empty()) {
      piece["id"] = call.id;
      piece["type"] = "function";
      function["name"] = call.name;
    }
    function["arguments"] = call.arguments;
    piece["function"] = std::move(function);
    out.push_back(std::move(piece));
  }
  return out;
}

std::string Event(const json& data) {
  // Invalid UTF-8 cannot reach here (the text is decoded by StreamingDecoder), but a dump must
  // never throw: replace rather than fail.
  return absl::StrCat("data: ", data.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return BadParam("", "the request body is not valid JSON");
  CompletionRequest request;
  try {
    K3_RETURN_IF_ERROR(Parse(parsed, endpoint, &request));
  } catch (const json::exception& e) {  // a type check missed above: still the client's input
    return BadParam("", absl::StrCat("malformed request: ", e.what()));
  }
  return request;
}

absl::Status ParamError(const std::string& param, const std::string& message) {
  return BadParam(param, message);
}

std::string ParamOf(const absl::Status& status) {
  const auto param = status.GetPayload(kParamPayload);
  return param.has_value() ? std::string(*param) : "";
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:  // a feature the request asks for (tool messages)
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 503;
    default:
      return 500;
  }
}

std::string ErrorBody(const absl::Status& status) {
  const int http = HttpStatusOf(status);
  const char* type = http == 401   ? "authentication_error"
                     : http == 404 ? "not_found_error"
                     : http < 500  ? "invalid_request_error"
                                   : "server_error";
  const std::string param = ParamOf(status);
  json error = {{"message", std::string(status.message())},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", absl::StatusCodeToString(status.code())}};
  return json{{"error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool HasDelta(const Choice& piece) {
  return !piece.text.empty() || !piece.reasoning.empty() || !piece.tool_calls.empty() ||
         (piece.logprobs.has_value() && !piece.logprobs->empty());
}

std::string CompletionBody(const ResponseHead& head, const std::vector<Choice>& choices,
                           const Usage& usage) {
  json body = HeadJson(head, /*chunk=*/false);
  body["choices"] = json::array();
  for (const Choice& c : choices) {
    json choice = {{"index", c.index},
                   {"logprobs", LogprobsJson(head.endpoint, c.logprobs)},
                   {"finish_reason", c.finish_reason}};
    if (head.endpoint == Endpoint::kChatCompletions) {
      json message = {{"role", "assistant"}};
      message["content"] = c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text);
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) message["tool_calls"] = ToolCallsJson(c.tool_calls, false);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    body["choices"].push_back(std::move(choice));
  }
  body["usage"] = UsageJson(usage);
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string CompletionChunkEvent(const ResponseHead& head, const Choice& piece, bool first) {
  json choice = {
      {"index", piece.index},
      {"logprobs", LogprobsJson(head.endpoint, piece.logprobs)},
      {"finish_reason", piece.finish_reason.empty() ? json(nullptr) : json(piece.finish_reason)}};
  if (head.endpoint == Endpoint::kChatCompletions) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !piece.text.empty()) delta["content"] = piece.text;
    if (!piece.reasoning.empty()) delta["reasoning_content"] = piece.reasoning;
    if (!piece.tool_calls.empty()) delta["tool_calls"] = ToolCallsJson(piece.tool_calls, true);
    choice["delta"] = delta;
  } else {
    choice["text"] = piece.text;
  }
  json body = HeadJson(head, /*chunk=*/true);
  body["choices"] = json::array({choice});
  return Event(body);
}

std::string UsageChunkEvent(const ResponseHead& head, const Usage& usage) {
  json body = HeadJson(head, /*chunk=*/true);
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return Event(body);
}

namespace {

json ModelJson(const std::string& model) {
  return {{"id", model}, {"object", "model"}, {"created", 0}, {"owned_by", "k3serve"}};
}

}  // namespace

std::string ModelsBody(const std::string& model) {
  return json{{"object", "list"}, {"data", json::array({ModelJson(model)})}}.dump();
}

std::string ModelBody(const std::string& model) { return ModelJson(model).dump(); }

}  // namespace k3
