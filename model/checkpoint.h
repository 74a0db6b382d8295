// Checkpoint: a model directory (config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json, whose "weight_map" maps tensor names to shard files). Opens every
// file memory-mapped and finds tensors by name with or without the "language_model." prefix.
// When both layouts are present the index wins. Thread-safe after Open (read-only).
#ifndef K3SERVE_MODEL_CHECKPOINT_H_
#define K3SERVE_MODEL_CHECKPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace k3 {

class Checkpoint {
 public:
  // Opens DIR. Shards named by the index must all exist and hold the tensors the index says.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  // `name` without prefix ("model.norm.weight"); finds it with or without "language_model.".
  // NotFound names the tensor and the directory.
  absl::StatusOr<TensorView> Find(std::string_view name) const;
  bool Has(std::string_view name) const;

  // Every mapped file, in shard-name order.
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;
  const SafetensorsFile* Locate(std::string_view name, std::string* stored_name) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const SafetensorsFile*> where_;  // stored name -> its file
};

// The safetensors files of checkpoint DIR, by the same rule as Checkpoint::Open (the index's
// shards, else model.safetensors), as paths, without opening them. NotFound when neither exists.
absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir);

}  // namespace k3

#endif  // K3SERVE_MODEL_CHECKPOINT_H_
