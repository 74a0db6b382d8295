#include "tools/random_model_folder.h"

#include "base/status_macros.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {

absl::Status WriteRandomModelFolder(const ModelConfig& config, uint64_t seed,
                                    const std::string& dir, const RandomCheckpointOptions& options) {
  K3_RETURN_IF_ERROR(WriteRandomCheckpoint(config, seed, dir, options));
  if (config.vocab_size < kSmallestTokenizerVocab) return absl::OkStatus();
  return WriteRandomTokenizer(
      dir, config.vocab_size,
      config.model_type == "kimi_k3" ? TokenizerFamily::kK3 : TokenizerFamily::kKimi);
}

absl::Status WriteRandomModelFolder(const ModelConfig& config, uint64_t seed,
                                    const std::string& dir, int shards) {
  RandomCheckpointOptions options;
  options.shards = shards;
  return WriteRandomModelFolder(config, seed, dir, options);
}

}  // namespace k3
