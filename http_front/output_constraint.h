// The shape constrained decoding keeps a chat answer in (tokenizer/token_constraint.h), for
// response_format json_object / json_schema and tool_choice required / a named function: the
// model's own format around a JSON value, so that what comes out parses (ChatOutputParser) into
// content that is that JSON, or into a tool call whose arguments follow the tool's parameters.
// With thinking on, the think section stays free until the model closes it.
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
absl::StatusOr<std::optional<k3serve::v1::OutputConstraint>> OutputConstraintOf(
    const CompletionRequest& request, const Tokenizer& tokenizer);

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_OUTPUT_CONSTRAINT_H_
