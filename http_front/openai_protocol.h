// The OpenAI API's JSON (completions and chat completions): request parsing with the checks that
// turn bad input into 400s, the response and server-sent-event chunk bodies, and the error shape
// {"error": {"message", "type", "param", "code"}}.
#ifndef K3SERVE_HTTP_FRONT_OPENAI_PROTOCOL_H_
#define K3SERVE_HTTP_FRONT_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tokenizer/chat_output_parser.h"
#include "tokenizer/chat_template.h"

namespace k3 {

enum class Endpoint { kCompletions, kChatCompletions };

struct CompletionRequest {
  std::string model;  // as the client named it (may be empty for completions)
  // The prompt: completions give text or ids, chat gives messages.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  std::vector<ChatMessage> messages;
  // Chat: the template's variables besides the messages: thinking and its effort
  // (chat_template_kwargs.thinking / thinking_effort, or reasoning_effort; on and "max" by
  // default, as the model's template has them), tools, tool_choice ("none" and "required"; a
  // named function renders as "auto" does) and response_format ("json_object", "json_schema").
  ChatOptions chat;
  // tool_choice: "auto" (the default with tools), "none", "required" or "function", then
  // `tool_choice_function` names it.
  std::string tool_choice = "none";
  std::string tool_choice_function;
  // response_format.json_schema.strict: a schema keyword constrained decoding cannot enforce is
  // a 400 naming it (tools: each function's own `strict`).
  bool response_format_strict = false;
  // thinking_budget: the most tokens of thinking before a structured answer (tool_choice
  // required / a function, response_format); nullopt: from the reasoning effort, within what
  // max_tokens leaves (http_front/output_constraint.h).
  std::optional<int> thinking_budget;
  std::optional<int> max_tokens;
  std::string max_tokens_param = "max_tokens";  // the name the client gave it by
  std::optional<float> temperature;  // [0, 2]
  std::optional<float> top_p;        // (0, 1]
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  int n = 1;                   // choices, [1, kMaxChoices]
  // Log-probabilities of the generated tokens with this many alternatives each; nullopt: none.
  // Chat: logprobs true and top_logprobs (0-20); completions: logprobs (0-5).
  std::optional<int> top_logprobs;
  bool skip_special_tokens = true;  // special tokens add nothing to the text (vLLM's field)
};

inline constexpr int kMaxChoices = 128;  // OpenAI's limit on n

// Parses and checks a request body. Chat: an assistant's tool_calls, a tool message's
// tool_call_id, `name` and reasoning_content go to the rendering; `tools` must be functions with
// names, and a named tool_choice must name one of them; `tools` keep the client's key order
// (Kimi K2's template writes them as they came). INVALID_ARGUMENT naming the field (ParamOf gives it) for
// malformed JSON, wrong types, values out of range and unsupported message contents. The
// `developer` role is read as `system` (OpenAI's newer name for it). A tool message must carry
// the tool_call_id of a call of an earlier assistant message. Ranges are OpenAI's; fields whose
// effect is not implemented (presence_penalty, frequency_penalty, logit_bias; completions' echo,
// suffix, best_of) are a 400 naming them unless they have their neutral value.
// Other unknown fields are ignored, as OpenAI's clients send fields a server may not know.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint);

// The request field an error is about ("" if none).
std::string ParamOf(const absl::Status& status);
// INVALID_ARGUMENT with `message`, about the request field `param` (ParamOf gives it back).
absl::Status ParamError(const std::string& param, const std::string& message);

// The HTTP status for an error: 400 INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION /
// UNIMPLEMENTED (the request asks for something not supported),
// 401 UNAUTHENTICATED, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE /
// DEADLINE_EXCEEDED, 500 otherwise.
int HttpStatusOf(const absl::Status& status);

// {"error": {...}} for a non-OK status; type from the HTTP status, code from the status code.
std::string ErrorBody(const absl::Status& status);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// What the responses of one request share.
struct ResponseHead {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  Endpoint endpoint = Endpoint::kCompletions;
};

// One generated token's log-probabilities, for a choice's `logprobs`.
struct TokenLogprob {
  std::string token;  // its bytes (a special token's name); may be part of a UTF-8 character
  float logprob = 0.f;
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens, most likely first
};

// One choice of a response (n > 1 gives several), or one choice's piece in a stream.
struct Choice {
  int index = 0;
  std::string text;  // chat: the content
  // Chat: the thinking section and the tool calls (ChatOutputParser); in a stream, deltas.
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;
  // "stop", "length" or "tool_calls"; in a stream, empty until the last chunk.
  std::string finish_reason;
  std::optional<std::vector<TokenLogprob>> logprobs;  // set when the request asked for them
};

// Whether a stream piece carries anything to send.
bool HasDelta(const Choice& piece);

// The whole (non-streamed) response. Chat adds reasoning_content and tool_calls where non-empty
// (content is then null when empty, as OpenAI's is).
std::string CompletionBody(const ResponseHead& head, const std::vector<Choice>& choices,
                           const Usage& usage);
// One server-sent event "data: {...}\n\n" carrying one choice's piece (chat: the delta's
// content, reasoning_content and tool_calls, a call's first piece with its id and name; `first`
// adds the assistant role).
std::string CompletionChunkEvent(const ResponseHead& head, const Choice& piece, bool first);
// The usage event of stream_options.include_usage (empty choices).
std::string UsageChunkEvent(const ResponseHead& head, const Usage& usage);
inline constexpr char kDoneEvent[] = "data: [DONE]\n\n";

// GET /v1/models, and GET /v1/models/{model}.
std::string ModelsBody(const std::string& model);
std::string ModelBody(const std::string& model);

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_OPENAI_PROTOCOL_H_
