// JSON written the way the model's Jinja chat template writes it (spec K3-TOKENIZER.md §4), so
// that rendering by ids matches the template byte for byte: K3's `json_sorted` macro and the
// `tojson` filter of the environment chat templates are rendered in (Python's json.dumps).
#ifndef K3SERVE_TOKENIZER_TEMPLATE_JSON_H_
#define K3SERVE_TOKENIZER_TEMPLATE_JSON_H_

#include <string>

#include "nlohmann/json.hpp"

namespace k3 {

// K3's json_sorted: no spaces, object keys in Jinja's `dictsort` order (ASCII case-insensitive,
// ties kept in their order), arrays as they are, non-ASCII characters unescaped.
std::string SortedTemplateJson(const nlohmann::ordered_json& value);

// Python's json.dumps(value, ensure_ascii=False): separators ", " and ": ", keys in their order.
std::string PythonJson(const nlohmann::ordered_json& value);

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_TEMPLATE_JSON_H_
