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

absl::Status LocalEngine::EnablePrefixCache(const PrefixCacheOptions& options) {
  K3_RETURN_IF_ERROR(options.Validate());
  prefix_cache_ = std::make_unique<PrefixCache>(config(), options);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::Generate(const std::vector<int32_t>& prompt,
                                                           const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  K3_RETURN_IF_ERROR(ValidateSamplingOptions(options.sampling));
  std::unique_ptr<SequenceState> state = runner_->NewSequence();
  Sampler sampler(options.sampling);
  // Every token fed or to feed: the prompt, then each generated token but the last.
  std::vector<int32_t> tokens = prompt;
  const int64_t prompt_size = static_cast<int64_t>(prompt.size());
  int64_t fed = prefix_cache_ ? prefix_cache_->Restore(prompt, state.get()) : 0;
  std::vector<int32_t> generated;
  std::vector<float> logits;
  while (static_cast<int>(generated.size()) < options.max_new_tokens) {
    const int64_t end = fed < prompt_size && prefix_cache_
                            ? prefix_cache_->PrefillCut(fed, prompt_size)
                            : static_cast<int64_t>(tokens.size());
    BatchEntry entry{state.get(), absl::MakeConstSpan(tokens).subspan(fed, end - fed), false};
    K3_RETURN_IF_ERROR(runner_->Step({entry}, &logits));
    fed = end;
    if (prefix_cache_) {
      K3_RETURN_IF_ERROR(prefix_cache_->Record(tokens, *state));
    }
    if (fed < prompt_size) continue;  // the prompt's first piece, up to its last block boundary
    K3_ASSIGN_OR_RETURN(bool ended, TakeNextToken(config(), options, logits, sampler, &generated));
    if (ended) break;
    tokens.push_back(generated.back());
  }
  return generated;
}

}  // namespace k3
