#include "engine/generation.h"

#include <algorithm>

#include "base/status_macros.h"

namespace k3 {

absl::StatusOr<bool> TakeNextToken(const ModelConfig& config, const GenerateOptions& options,
                                   absl::Span<const float> logits, Sampler& sampler,
                                   std::vector<int32_t>* generated) {
  K3_RETURN_IF_ERROR(CheckLogitsFinite(logits.data(), config.vocab_size));
  if (options.on_logits) options.on_logits(logits);
  const int32_t next = sampler.Next(logits.data(), config.vocab_size);
  generated->push_back(next);
  if (options.on_token) options.on_token(next);
  return (next == config.eos_token_id && !options.ignore_eos) ||
         std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), next) !=
             options.stop_token_ids.end();
}

}  // namespace k3
