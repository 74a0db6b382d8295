#include "bench/random_weights.h"

#include <filesystem>
#include <utility>

#include "base/status_macros.h"
#include "model/config.h"
#include "tools/random_model_folder.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<ModelWeights>> CachedRandomWeights(
    const std::string& config_name, const std::string& folder_prefix) {
  K3_ASSIGN_OR_RETURN(ModelConfig config, NamedConfig(config_name));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (folder_prefix + config_name);
  if (!std::filesystem::exists(dir / "config.json")) {
    K3_RETURN_IF_ERROR(WriteRandomModelFolder(config, 1, dir.string()));
  }
  return LoadWeights(dir.string(), WeightSelection::All());
}

}  // namespace k3
