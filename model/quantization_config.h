// QuantizationConfig: the `quantization_config` of a config.json (spec §10). k3serve reads one
// scheme, the K3 release's: compressed-tensors "mxfp4-pack-quantized", 4-bit E2M1 weights in
// groups of 32 sharing an E8M0 uint8 scale, activations unquantized. Any other quant_method or
// format, or weights other than 4-bit floats in groups of 32, is InvalidArgument naming the field
// and the value found. The weight fields are read from a top-level "weights" object or from each
// "config_groups" entry (compressed-tensors' own layout); at least one must be present.
//
// Thread-safety: QuantizationConfig is a plain value; QuantizationIgnoreList is immutable after
// Create and safe to share.
#ifndef K3SERVE_MODEL_QUANTIZATION_CONFIG_H_
#define K3SERVE_MODEL_QUANTIZATION_CONFIG_H_

#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace k3 {

struct QuantizationConfig {
  // Modules left unquantized (BF16): exact module names ("model.layers.1.mlp.down_proj"), or
  // "re:" + a regular expression matched from the start of the name, as compressed-tensors does.
  std::vector<std::string> ignore;

  bool operator==(const QuantizationConfig&) const = default;
};

// The K3 release's quantization_config (spec §10): everything but the routed experts is ignored.
QuantizationConfig K3ReleaseQuantization();

// Parses a quantization_config object; `path` prefixes field names in messages
// ("text_config.quantization_config.").
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& value,
                                                           std::string_view path);

// The release's layout of the object (one config group targeting Linear), as one line of JSON.
std::string QuantizationConfigToJson(const QuantizationConfig& config);

// The compiled ignore list.
class QuantizationIgnoreList {
 public:
  // InvalidArgument naming an entry whose regular expression does not compile.
  static absl::StatusOr<QuantizationIgnoreList> Create(const std::vector<std::string>& ignore);

  // Whether `module` (a tensor name without ".weight..."; a "language_model." prefix is kept)
  // stays unquantized.
  bool Ignores(std::string_view module) const;

 private:
  std::vector<std::string> names_;
  std::vector<std::regex> patterns_;
};

}  // namespace k3

#endif  // K3SERVE_MODEL_QUANTIZATION_CONFIG_H_
