// The shape constrained decoding keeps a chat answer in (tokenizer/token_constraint.h), for
// response_format json_object / json_schema and tool_choice required / a named function: the
// model's own format around a JSON value, so that what comes out parses (ChatOutputParser) into
// content that is that JSON, or into a tool call whose arguments follow the tool's parameters.
//
// With thinking on, the think section is free text (no special token but its close, so the
// answer cannot end inside it) of at most a budget of tokens, after which it closes:
// `thinking_budget` where the request gives it, else by reasoning effort (low 1024, medium
// 4096, high 16384, max 32768 tokens) but at most half of what max_tokens leaves beside the
// shortest answer. The worker also keeps room for the shortest rest of the answer at every
// token (tokenizer/token_constraint.h), so the answer always ends within max_tokens.
#ifndef K3SERVE_HTTP_FRONT_OUTPUT_CONSTRAINT_H_
#define K3SERVE_HTTP_FRONT_OUTPUT_CONSTRAINT_H_

#include <optional>

#include "absl/status/statusor.h"
#include "http_front/openai_protocol.h"
#include "proto/generate.pb.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

// nullopt where the request asks for no constraint. K3: a tool call is written with a json block
// (<|open|>json type="object"<|sep|>), which the template renders for JSON-string arguments.
// `max_tokens`: the answer's token limit (0: unknown, the worker's). INVALID_ARGUMENT naming the
// parameter (ParamOf) for a schema that cannot be compiled (with strict: a keyword that cannot
// be enforced; tools: the function's `strict`), for max_tokens below the shortest answer, and
// for a thinking_budget that max_tokens cannot hold beside it.
absl::StatusOr<std::optional<k3serve::v1::OutputConstraint>> OutputConstraintOf(
    const CompletionRequest& request, const Tokenizer& tokenizer, int max_tokens);

// The thinking budget of an effort ("low" ... "max").
int ThinkingBudgetOf(const std::string& effort);

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_OUTPUT_CONSTRAINT_H_
