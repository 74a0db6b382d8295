// Typed reads from JSON parsed by nlohmann-json, and the two writing helpers the model files need.
// Integer reads accept JSON integers and integral floats ("2.0"), check the range, and name the
// field by its dotted path ("text_config.linear_attn_config.head_dim") with what was found.
//
// No exception leaves this module: parse errors come back as InvalidArgument. The values handed
// out are plain nlohmann::json; read them with the is_*() checks before any get<>() (which throws
// on a type mismatch).
//
// Internal to model/: config.json, safetensors headers and index files share these helpers.
#ifndef K3SERVE_MODEL_JSON_VALUE_H_
#define K3SERVE_MODEL_JSON_VALUE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {
namespace json {

// Parses `text`, which must hold one JSON object nested at most 64 levels deep.
absl::StatusOr<nlohmann::json> ParseObject(std::string_view text);

// Short description of a value for messages: `string "abc"`, `number 1.5`, `null`, `a list`, ...
std::string Describe(const nlohmann::json& value);

// Exact integer in [min, max]; `what` names the field in the message.
absl::StatusOr<int64_t> ToInt(const nlohmann::json& value, std::string_view what, int64_t min,
                              int64_t max);
// Finite number that fits a float.
absl::StatusOr<float> ToFloat(const nlohmann::json& value, std::string_view what);

// Appends `s` to `out` as a quoted JSON string (bytes that are not UTF-8 become U+FFFD).
void AppendQuoted(std::string_view s, std::string* out);

// Shortest decimal text that reads back as the same float.
std::string FormatFloat(float value);

}  // namespace json
}  // namespace k3

#endif  // K3SERVE_MODEL_JSON_VALUE_H_
