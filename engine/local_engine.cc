#include "engine/local_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Open(
    const std::string& model_dir, const std::function<void(size_t, size_t)>& progress) {
  std::unique_ptr<LocalEngine> engine(new LocalEngine);
  K3_ASSIGN_OR_RETURN(engine->weights_, LoadWeights(model_dir, WeightSelection::All(), progress));
  engine->moe_ = std::make_unique<LocalRoutedMoe>(engine->weights_.get());
  engine->runner_ = std::make_unique<ModelRunner>(engine->weights_.get(), engine->moe_.get());
  return engine;
}

absl::StatusOr<std::vector<float>> LocalEngine::Logits(const std::vector<int32_t>& tokens,
                                                       bool decode) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  std::unique_ptr<SequenceState> state = runner_->NewSequence();
  if (!decode) {
    std::vector<float> logits;
    BatchEntry entry{state.get(), absl::MakeConstSpan(tokens), /*all_logits=*/true};
    K3_RETURN_IF_ERROR(runner_->Step({entry}, &logits));
    return logits;
  }
  const int64_t vocab = config().vocab_size;
  std::vector<float> all(tokens.size() * vocab), step;
  for (size_t t = 0; t < tokens.size(); ++t) {
    BatchEntry entry{state.get(), absl::MakeConstSpan(&tokens[t], 1), true};
    K3_RETURN_IF_ERROR(runner_->Step({entry}, &step));
    std::copy(step.begin(), step.end(), all.begin() + t * vocab);
  }
  return all;
}

}  // namespace k3
