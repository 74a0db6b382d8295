// LocalEngine: the whole model's forward pass in one process on the CPU: weights, the in-process
// routed experts and a ModelRunner, for the tests and benches that step sequences themselves
// (logits against the fp64 reference, step timings, the oracles of the generation tests). It does
// not generate: generation is the GenerationScheduler's (engine/process_engine.h). Not
// thread-safe.
#ifndef K3SERVE_ENGINE_LOCAL_ENGINE_H_
#define K3SERVE_ENGINE_LOCAL_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/model_runner.h"
#include "model/weights.h"
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

  // The routed experts' routing hook (LocalRoutedMoe::set_routing_hook), for tests that hold
  // another engine's routing.
  void SetRoutingHook(LocalRoutedMoe::RoutingHook hook) {
    moe_->set_routing_hook(std::move(hook));
  }

 private:
  LocalEngine() = default;
  // In dependency order (members are destroyed in reverse).
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<LocalRoutedMoe> moe_;        // reads weights_
  std::unique_ptr<ModelRunner> runner_;        // reads weights_ and moe_
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_LOCAL_ENGINE_H_
