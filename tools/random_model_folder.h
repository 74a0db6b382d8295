// Random model folders for tests, benchmarks and `k3serve random-checkpoint`: a random checkpoint
// (model/random_checkpoint.h) and, beside it, a small tokenizer that fits its vocabulary
// (tokenizer/random_tokenizer.h), so that servers started on the folder take text as well as
// token ids. The two are put together here because model/ may not include tokenizer/, and
// tokenizer/ may not depend on kernels/, which the checkpoint writer uses (docs/ARCHITECTURE.md).
#ifndef K3SERVE_TOOLS_RANDOM_MODEL_FOLDER_H_
#define K3SERVE_TOOLS_RANDOM_MODEL_FOLDER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

namespace k3 {

// Writes DIR/config.json and the weights as WriteRandomCheckpoint does, then, when the vocabulary
// has room for the bytes and special tokens (vocab_size >= kSmallestTokenizerVocab), a tokenizer
// with exactly vocab_size ids (tiktoken.model, tokenizer_config.json) whose special tokens carry
// the config's family's names (K3 for model_type "kimi_k3", Kimi otherwise). Creates DIR if needed.
absl::Status WriteRandomModelFolder(const ModelConfig& config, uint64_t seed,
                                    const std::string& dir, const RandomCheckpointOptions& options);
absl::Status WriteRandomModelFolder(const ModelConfig& config, uint64_t seed,
                                    const std::string& dir, int shards = 1);

}  // namespace k3

#endif  // K3SERVE_TOOLS_RANDOM_MODEL_FOLDER_H_
