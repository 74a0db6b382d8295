#include "tokenizer/template_json.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"

namespace k3 {
namespace {

using nlohmann::ordered_json;

std::string Scalar(const ordered_json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
}

void Write(const ordered_json& value, bool sorted, std::string* out) {
  const char* item_separator = sorted ? "," : ", ";
  const char* key_separator = sorted ? ":" : ": ";
  if (value.is_object()) {
    std::vector<const std::string*> keys;
    for (auto it = value.begin(); it != value.end(); ++it) keys.push_back(&it.key());
    if (sorted) {
      std::stable_sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) {
        return absl::AsciiStrToLower(*a) < absl::AsciiStrToLower(*b);
      });
    }
    out->push_back('{');
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) out->append(item_separator);
      out->append(Scalar(ordered_json(*keys[i])));
      out->append(key_separator);
      Write(value.at(*keys[i]), sorted, out);
    }
    out->push_back('}');
  } else if (value.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out->append(item_separator);
      Write(value[i], sorted, out);
    }
    out->push_back(']');
  } else {
    out->append(Scalar(value));
  }
}

}  // namespace

std::string SortedTemplateJson(const nlohmann::ordered_json& value) {
  std::string out;
  Write(value, /*sorted=*/true, &out);
  return out;
}

std::string PythonJson(const nlohmann::ordered_json& value) {
  std::string out;
  Write(value, /*sorted=*/false, &out);
  return out;
}

}  // namespace k3
