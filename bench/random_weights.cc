#include "bench/random_weights.h"

#include <filesystem>
#include <utility>

#include "model/config.h"
#include "tools/random_model_folder.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<ModelWeights>> CachedRandomWeights(
    const std::string& config_name, const std::string& folder_prefix) {
  absl::StatusOr<ModelConfig> config = NamedConfig(config_name);
  if (!config.ok()) return config.status();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (folder_prefix + config_name);
  if (!std::filesystem::exists(dir / "config.json")) {
    if (absl::Status s = WriteRandomModelFolder(*config, 1, dir.string()); !s.ok()) return s;
  }
  return LoadWeights(dir.string(), WeightSelection::All());
}

}  // namespace k3
