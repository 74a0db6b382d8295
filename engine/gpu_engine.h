// GpuEngine: the whole model in one process on one GPU (`k3serve generate --device cuda:N`):
// weights, a GpuModelRunner for everything but the routed experts, and the routed experts: MXFP4
// ones on the same GPU (GpuExpertCompute, one per MoE layer), routed on the device by default
// (the runner's device path: no host round trip inside a step) or, on request, by a
// LocalRoutedMoe on the host; BF16 ones on the CPU through a LocalRoutedMoe. Logits keeps
// LocalEngine's contract, so the two can be compared; generation is the GenerationScheduler's over
// NewStepRunner (engine/process_engine.h, `generate --device cuda:N`). Not thread-safe.
#ifndef K3SERVE_ENGINE_GPU_ENGINE_H_
#define K3SERVE_ENGINE_GPU_ENGINE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attention_nodes/cuda/gpu_model_runner.h"
#include "attention_nodes/forward/step_runner.h"
#include "engine/local_routed_moe.h"
#include "expert_nodes/gpu_expert_compute.h"
#include "model/weights.h"

namespace k3 {

// Where the router of MXFP4 experts runs (BF16 experts are always routed on the host).
enum class GpuRouting { kDevice, kHost };

class GpuEngine {
 public:
  // Loads the checkpoint and uploads it to CUDA device `device`. Unavailable without a usable
  // device; InvalidArgument for weights the GPU path does not take (BF16 non-expert matrices are
  // required). `progress` (optional) sees (done, total) tensor counts while the checkpoint loads.
  static absl::StatusOr<std::unique_ptr<GpuEngine>> Open(
      const std::string& model_dir, int device, const GpuRunnerCapacity& capacity = {},
      const std::function<void(size_t, size_t)>& progress = nullptr,
      GpuRouting routing = GpuRouting::kDevice);
  ~GpuEngine();

  const ModelConfig& config() const { return weights_->config; }

  // Decode steps as CUDA graphs (GpuModelRunner::SetCudaGraphs); FailedPrecondition unless the
  // experts are routed on the device.
  absl::Status EnableCudaGraphs();
  // Decode steps that ran as a graph so far.
  int64_t graph_launches() const { return runner_->graph_launches(); }

  // For tests that hold a CPU engine's routing to this one's (LocalEngine::SetRoutingHook): sees
  // each MoE layer's chosen experts, [rows, top_k] in choice order, as the experts are run: on
  // the host router's Routing, or (device routing) copied from the gate's output, which
  // synchronizes the step (so not with CUDA graphs: EnableCudaGraphs then fails). Null: none.
  using RoutingObserver =
      std::function<void(int layer, const std::vector<int32_t>& experts, int top_k)>;
  void SetRoutingObserver(RoutingObserver observer);

  // LocalEngine::Logits: [tokens, vocab], one prefill or (decode) one token per step.
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens, bool decode);

  // The scheduler's seam over this engine's runner (GpuStepRunner::Over): what ProcessEngine
  // generates with. It shares the runner with Logits (use one at a time) and must not outlive
  // the engine.
  std::unique_ptr<StepRunner> NewStepRunner();

 private:
  GpuEngine() = default;
  // One step for `sequence` with all_logits, appended to `logits`.
  absl::Status StepInto(GpuSequence* sequence, absl::Span<const int32_t> tokens, bool all_logits,
                        std::vector<float>* logits);

  std::unique_ptr<ModelWeights> weights_;
  std::vector<std::unique_ptr<GpuExpertCompute>> experts_;  // per layer; null where not MoE
  std::unique_ptr<LocalRoutedMoe> moe_;
  int device_ = 0;
  std::shared_ptr<GpuModelRunner> runner_;
  RoutingObserver observer_;
  std::vector<int32_t> observed_;  // device routing's ids, copied for observer_
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_GPU_ENGINE_H_
