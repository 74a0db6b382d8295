// Typed reads from JSON parsed by protobuf's JSON parser into google::protobuf::Struct (the only
// JSON library available here). Struct holds every number as a double, so integer reads check that
// the value is integral and in range. Messages name the field by its dotted path ("text_config.
// linear_attn_config.head_dim") and say what was found.
//
// Internal to model/: config.json, safetensors headers and index files share these helpers.
#ifndef K3SERVE_MODEL_JSON_VALUE_H_
#define K3SERVE_MODEL_JSON_VALUE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/struct.pb.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {
namespace json {

// Parses `text`, which must hold a JSON object.
absl::StatusOr<google::protobuf::Struct> ParseObject(std::string_view text);

// Short description of a value for messages: `string "abc"`, `number 1.5`, `null`, `list`, ...
std::string Describe(const google::protobuf::Value& value);

// Exact integer in [min, max]; `what` names the field in the message.
absl::StatusOr<int64_t> ToInt(const google::protobuf::Value& value, std::string_view what,
                              int64_t min, int64_t max);
// Finite number that fits a float.
absl::StatusOr<float> ToFloat(const google::protobuf::Value& value, std::string_view what);

// Appends `s` to `out` as a quoted JSON string.
void AppendQuoted(std::string_view s, std::string* out);

// Shortest decimal text that reads back as the same float.
std::string FormatFloat(float value);

}  // namespace json
}  // namespace k3

#endif  // K3SERVE_MODEL_JSON_VALUE_H_
