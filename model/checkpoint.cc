#include "model/checkpoint.h"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "model/json_value.h"

namespace k3 {
namespace {

constexpr char kPrefix[] = "language_model.";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Shard names come from a file; keep them inside the checkpoint directory.
bool SafeRelativePath(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

// The index's weight_map as tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto root = json::ParseObject(text.str());
  if (!root.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", root.status().message()));
  auto it = root->find("weight_map");
  if (it == root->end() || !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::string> map;
  for (const auto& [tensor, shard] : it->items()) {
    if (!shard.is_string() || !SafeRelativePath(shard.get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map entry '", tensor,
                                                     "' must name a file inside the directory, got ",
                                                     json::Describe(shard)));
    }
    map[tensor] = shard.get<std::string>();
  }
  return map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  K3_ASSIGN_OR_RETURN(ckpt->config_, LoadModelConfig(dir + "/config.json"));

  const std::string index_path = dir + "/" + kIndexFile;
  if (Exists(index_path)) {
    K3_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index_path));
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [tensor, shard] : weight_map) shards.emplace(shard, nullptr);
    for (auto& [shard, file] : shards) {
      auto opened = SafetensorsFile::Open(dir + "/" + shard);
      if (!opened.ok()) {
        return absl::Status(opened.status().code(),
                            absl::StrCat(index_path, " lists shard ", shard, ": ",
                                         opened.status().message()));
      }
      file = opened->get();
      ckpt->files_.push_back(*std::move(opened));
    }
    for (const auto& [tensor, shard] : weight_map) {
      const SafetensorsFile* file = shards.at(shard);
      if (file->tensors().count(tensor) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, " maps tensor '", tensor,
                                                       "' to ", shard,
                                                       ", which does not contain it"));
      }
      ckpt->where_[tensor] = file;
    }
  } else if (Exists(dir + "/" + kSingleFile)) {
    K3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + kSingleFile));
    ckpt->files_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir, " has neither ", kSingleFile, " nor ", kIndexFile));
  }
  // Tensors a shard holds beyond what the index lists stay reachable (the first shard wins).
  for (const auto& file : ckpt->files_) {
    for (const auto& [name, info] : file->tensors()) ckpt->where_.emplace(name, file.get());
  }
  return ckpt;
}

absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir) {
  const std::string index_path = dir + "/" + kIndexFile;
  if (!Exists(index_path)) {
    if (!Exists(dir + "/" + kSingleFile)) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", dir, " has neither ", kSingleFile, " nor ", kIndexFile));
    }
    return std::vector<std::string>{dir + "/" + kSingleFile};
  }
  K3_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index_path));
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
  std::vector<std::string> paths;
  for (const std::string& shard : shards) paths.push_back(dir + "/" + shard);
  return paths;
}

const SafetensorsFile* Checkpoint::Locate(std::string_view name, std::string* stored_name) const {
  std::string candidates[2] = {std::string(name), ""};
  std::string_view prefix = kPrefix;
  if (name.substr(0, prefix.size()) == prefix) {
    candidates[1] = std::string(name.substr(prefix.size()));
  } else {
    candidates[1] = absl::StrCat(kPrefix, Sv(name));
  }
  for (std::string& candidate : candidates) {
    auto it = where_.find(candidate);
    if (it != where_.end()) {
      *stored_name = std::move(candidate);
      return it->second;
    }
  }
  return nullptr;
}

absl::StatusOr<TensorView> Checkpoint::Find(std::string_view name) const {
  std::string stored;
  const SafetensorsFile* file = Locate(name, &stored);
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor '", Sv(name), "' (with or without '", kPrefix,
                                            "') is not in checkpoint ", dir_));
  }
  return file->Get(stored);
}

bool Checkpoint::Has(std::string_view name) const {
  std::string stored;
  return Locate(name, &stored) != nullptr;
}

}  // namespace k3
