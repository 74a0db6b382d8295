#include "model/quantization_config.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/json_value.h"

namespace k3 {
namespace {

using Json = nlohmann::json;

constexpr char kMethod[] = "compressed-tensors";
constexpr char kFormat[] = "mxfp4-pack-quantized";
constexpr std::string_view kRegexPrefix = "re:";
// Exact names match with or without the multimodal checkpoint's prefix (spec §2).
constexpr std::string_view kLanguageModelPrefix = "language_model.";

// `object` must be a JSON object.
const Json* Field(const Json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() ? nullptr : &*it;
}

bool IsNull(const Json* v) { return v == nullptr || v->is_null(); }

// A required string field equal to `expected`.
absl::Status ExpectString(const Json& object, const char* name, const char* expected,
                          const std::string& path) {
  const Json* v = Field(object, name);
  if (v == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, name, " is missing (k3serve reads \"", expected, "\")"));
  }
  if (!v->is_string() || v->get_ref<const std::string&>() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(path, name, " ", json::Describe(*v),
                                                   " is not supported (k3serve reads \"", expected,
                                                   "\", spec §10)"));
  }
  return absl::OkStatus();
}

// An optional integer field that must equal `expected` when present.
absl::Status ExpectInt(const Json& object, const char* name, int64_t expected,
                       const std::string& path) {
  const Json* v = Field(object, name);
  if (v == nullptr) return absl::OkStatus();
  K3_ASSIGN_OR_RETURN(int64_t value, json::ToInt(*v, path + name, INT64_MIN, INT64_MAX));
  if (value != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, name, " ", value, " is not supported (MXFP4 has ", expected, ")"));
  }
  return absl::OkStatus();
}

// One "weights" object and its sibling "input_activations".
absl::Status CheckScheme(const Json& scheme, const std::string& path) {
  const Json* weights = Field(scheme, "weights");
  if (!weights->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, "weights must be an object, got ", json::Describe(*weights)));
  }
  const Json& w = *weights;
  const std::string wpath = path + "weights.";
  K3_RETURN_IF_ERROR(ExpectInt(w, "num_bits", 4, wpath));
  K3_RETURN_IF_ERROR(ExpectInt(w, "group_size", 32, wpath));
  if (Field(w, "type") != nullptr) K3_RETURN_IF_ERROR(ExpectString(w, "type", "float", wpath));
  if (Field(w, "strategy") != nullptr) {
    K3_RETURN_IF_ERROR(ExpectString(w, "strategy", "group", wpath));
  }
  if (!IsNull(Field(scheme, "input_activations"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, "input_activations: quantized activations are not supported (the release has null)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& value,
                                                           std::string_view path_view) {
  const std::string path(path_view);
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.substr(0, path.size() - 1), " must be an object, got ", json::Describe(value)));
  }
  const Json& q = value;
  K3_RETURN_IF_ERROR(ExpectString(q, "quant_method", kMethod, path));
  K3_RETURN_IF_ERROR(ExpectString(q, "format", kFormat, path));
  int schemes = 0;
  if (Field(q, "weights") != nullptr) {
    K3_RETURN_IF_ERROR(CheckScheme(q, path));
    ++schemes;
  }
  if (const Json* groups = Field(q, "config_groups"); !IsNull(groups)) {
    if (!groups->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "config_groups must be an object, got ", json::Describe(*groups)));
    }
    for (const auto& [name, group] : groups->items()) {
      const std::string gpath = absl::StrCat(path, "config_groups.", name, ".");
      if (!group.is_object() || Field(group, "weights") == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(gpath.substr(0, gpath.size() - 1), " must be an object with \"weights\""));
      }
      K3_RETURN_IF_ERROR(CheckScheme(group, gpath));
      ++schemes;
    }
  }
  if (schemes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, "weights: missing (neither \"weights\" nor \"config_groups\")"));
  }
  QuantizationConfig config;
  if (const Json* ignore = Field(q, "ignore"); !IsNull(ignore)) {
    if (!ignore->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, "ignore must be a list of strings, got ", json::Describe(*ignore)));
    }
    for (size_t i = 0; i < ignore->size(); ++i) {
      const Json& entry = (*ignore)[i];
      if (!entry.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, "ignore[", i, "] must be a string, got ", json::Describe(entry)));
      }
      config.ignore.push_back(entry.get<std::string>());
    }
  }
  if (auto list = QuantizationIgnoreList::Create(config.ignore); !list.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, list.status().message()));
  }
  return config;
}

QuantizationConfig K3ReleaseQuantization() {
  return {{"re:.*self_attn.*", "re:.*shared_experts.*",
           R"(re:.*mlp\.(gate|up|gate_up|down)_proj.*)", "re:.*lm_head.*", "re:.*vision_tower.*",
           "re:.*mm_projector.*"}};
}

std::string QuantizationConfigToJson(const QuantizationConfig& config) {
  std::string ignore;
  for (const std::string& entry : config.ignore) {
    if (!ignore.empty()) ignore += ", ";
    json::AppendQuoted(entry, &ignore);
  }
  return absl::StrCat(
      "{\"quant_method\": \"", kMethod, "\", \"format\": \"", kFormat,
      "\", \"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": {\"targets\": "
      "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 32, "
      "\"strategy\": \"group\", \"symmetric\": true, \"scale_dtype\": \"torch.uint8\"}, "
      "\"input_activations\": null}}, \"ignore\": [",
      ignore, "]}");
}

absl::StatusOr<QuantizationIgnoreList> QuantizationIgnoreList::Create(
    const std::vector<std::string>& ignore) {
  QuantizationIgnoreList list;
  for (size_t i = 0; i < ignore.size(); ++i) {
    const std::string& entry = ignore[i];
    if (entry.compare(0, kRegexPrefix.size(), kRegexPrefix) != 0) {
      list.names_.push_back(entry);
      continue;
    }
    // std::regex reports a bad pattern by throwing; keep that inside this function.
    try {
      list.patterns_.emplace_back(entry.substr(kRegexPrefix.size()), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ignore[", i, "] \"", entry, "\" is not a valid regular expression: ", e.what()));
    }
  }
  return list;
}

bool QuantizationIgnoreList::Ignores(std::string_view module) const {
  std::string_view bare = module;
  if (bare.starts_with(kLanguageModelPrefix)) bare.remove_prefix(kLanguageModelPrefix.size());
  for (const std::string& name : names_) {
    if (module == name || bare == name) return true;
  }
  for (const std::regex& pattern : patterns_) {
    if (std::regex_search(module.begin(), module.end(), pattern,
                          std::regex_constants::match_continuous)) {
      return true;
    }
  }
  return false;
}

}  // namespace k3
