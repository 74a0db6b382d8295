// The spec's named test configurations (spec §12), kept apart from the parser so config.cc holds
// only parsing, validation and serialization. Their texts are the files in model/named_configs/
// (verbatim from the spec; k3-slice, §12.7, has every matrix at K3's real shape and is the GPU step
// benchmark's model), compiled in by the genrule //model:named_config_texts.
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/config.h"

namespace k3 {
namespace {

struct NamedConfigText {
  std::string_view name;  // the file's name without .json
  std::string_view json;
};

constexpr NamedConfigText kNamedConfigTexts[] = {
#include "model/named_config_texts.inc"
};

}  // namespace

absl::StatusOr<ModelConfig> NamedConfig(std::string_view name) {
  // k3-tiny-8: k3-tiny without its last layer (8 layers, MLA at 4 and 8).
  const bool tiny_8 = name == "k3-tiny-8";
  const std::string_view file = tiny_8 ? "k3-tiny" : name;
  for (const NamedConfigText& text : kNamedConfigTexts) {
    if (text.name != file) continue;
    K3_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text.json));
    if (!tiny_8) return config;
    config.num_hidden_layers = 8;
    config.linear_attn.full_attn_layers = {4, 8};
    K3_RETURN_IF_ERROR(ValidateModelConfig(config));
    return config;
  }
  std::string known = "k3-tiny-8";
  for (const NamedConfigText& text : kNamedConfigTexts) known += ", " + std::string(text.name);
  return absl::NotFoundError(
      absl::StrCat("no named config \"", std::string(name), "\" (known: ", known, ")"));
}

}  // namespace k3
