// LocalEngine: the whole model in one process: weights, the in-process routed experts and a
// ModelRunner. Backs the CLI's `logits` and local `generate`, and the single-process side of the
// cross-tier tests. With a prefix cache (EnablePrefixCache), Generate restores the longest cached
// prefix of the prompt and records the sequence's state at block boundaries, so a conversation's
// next turn prefills only what is new. Not thread-safe.
#ifndef K3SERVE_ENGINE_LOCAL_ENGINE_H_
#define K3SERVE_ENGINE_LOCAL_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/model_runner.h"
#include "attention_nodes/prefix_cache.h"
#include "model/weights.h"
#include "engine/generation.h"
#include "engine/local_routed_moe.h"

namespace k3 {

class LocalEngine {
 public:
  // `progress` (optional) sees (done, total) tensor counts while the checkpoint loads.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Open(
      const std::string& model_dir, const std::function<void(size_t, size_t)>& progress = nullptr);

  const ModelConfig& config() const { return weights_->config; }
  ModelRunner& runner() { return *runner_; }

  // Logits of every position, [tokens, vocab]: one prefill, or (decode) one token per step through
  // the caches.
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens, bool decode);

  // From now on Generate reuses and records prefixes (PrefixCache). INVALID_ARGUMENT for bad
  // options.
  absl::Status EnablePrefixCache(const PrefixCacheOptions& options);
  // Null unless enabled.
  const PrefixCache* prefix_cache() const { return prefix_cache_.get(); }

  // The routed experts' routing hook (LocalRoutedMoe::set_routing_hook), for tests that hold
  // another engine's routing.
  void SetRoutingHook(LocalRoutedMoe::RoutingHook hook) {
    moe_->set_routing_hook(std::move(hook));
  }

  // New tokens after `prompt`; stops at max_new_tokens or after emitting a stop token or (unless
  // ignore_eos) the model's eos_token_id.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const GenerateOptions& options);

 private:
  LocalEngine() = default;
  // In dependency order (members are destroyed in reverse).
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<LocalRoutedMoe> moe_;        // reads weights_
  std::unique_ptr<ModelRunner> runner_;        // reads weights_ and moe_
  std::unique_ptr<PrefixCache> prefix_cache_;  // null unless EnablePrefixCache
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_LOCAL_ENGINE_H_
