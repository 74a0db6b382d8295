// What a generation asks for (GenerateOptions) and the step both engines share after each forward
// pass: check the logits row, sample the next token and tell the caller, and say whether the
// generation ends there (LocalEngine on the CPU, GpuEngine on a GPU).
#ifndef K3SERVE_ENGINE_GENERATION_H_
#define K3SERVE_ENGINE_GENERATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/sampler.h"
#include "model/config.h"

namespace k3 {

struct GenerateOptions {
  SamplingOptions sampling;
  int max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  // true: the model's eos_token_id does not end generation
  // Sees each token as soon as it is sampled (an interactive front streaming the answer); null:
  // none.
  std::function<void(int32_t)> on_token;
  // Sees the logits row each token is sampled from, before on_token; null: none.
  std::function<void(absl::Span<const float>)> on_logits;
};

// Samples the next token from `logits` (one row of config.vocab_size) into `generated`, after
// on_logits and before on_token; returns whether generation ends with it (a stop token, or the
// model's eos_token_id unless ignore_eos). INTERNAL for a non-finite row (CheckLogitsFinite).
absl::StatusOr<bool> TakeNextToken(const ModelConfig& config, const GenerateOptions& options,
                                   absl::Span<const float> logits, Sampler& sampler,
                                   std::vector<int32_t>* generated);

}  // namespace k3

#endif  // K3SERVE_ENGINE_GENERATION_H_
