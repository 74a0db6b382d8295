#include "engine/oracle_generation.h"

#include <algorithm>

#include "base/status_macros.h"

namespace k3 {

absl::StatusOr<std::vector<int32_t>> OracleGenerate(LocalEngine& engine,
                                                    const GenerationRequest& request,
                                                    std::vector<std::vector<float>>* logits) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  K3_RETURN_IF_ERROR(ValidateSamplingOptions(request.sampling));
  const ModelConfig& config = engine.config();
  std::unique_ptr<SequenceState> state = engine.runner().NewSequence();
  Sampler sampler(request.sampling);
  std::vector<int32_t> generated;
  std::vector<float> row;
  absl::Span<const int32_t> feed = request.prompt;
  while (static_cast<int>(generated.size()) < request.max_new_tokens) {
    const BatchEntry entry{state.get(), feed, /*all_logits=*/false};
    K3_RETURN_IF_ERROR(engine.runner().Step({entry}, &row));
    K3_RETURN_IF_ERROR(CheckLogitsFinite(row.data(), config.vocab_size));
    if (logits != nullptr) logits->push_back(row);
    generated.push_back(sampler.Next(row.data(), config.vocab_size));
    const int32_t token = generated.back();
    if ((token == config.eos_token_id && !request.ignore_eos) ||
        std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
            request.stop_token_ids.end()) {
      break;
    }
    feed = absl::MakeConstSpan(&generated.back(), 1);
  }
  return generated;
}

}  // namespace k3
