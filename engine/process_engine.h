// ProcessEngine: the whole model in this process, generating through the one generation loop there
// is: a GenerationScheduler (attention_nodes/scheduler/generation_scheduler.h: continuous batching,
// the prefix cache, the stop rule, sampling) stepping the forward pass of `--device` (the syntax of
// `k3serve expert --device`: cpu, cuda or cuda:N). On the CPU the runner is a ModelRunner with the
// router math and experts in process (LocalRoutedMoe); on a CUDA device, where the build has the
// CUDA Toolkit, GpuEngine's GpuModelRunner behind a GpuStepRunner (engine/gpu_engine.h). `k3serve
// generate --model`, `chat --model` and `logits` use it, and so do tests and benches that need the
// single-process answer.
//
// Thread-safety: Generate and Logits may be called from any thread, at once (requests batch).
#ifndef K3SERVE_ENGINE_PROCESS_ENGINE_H_
#define K3SERVE_ENGINE_PROCESS_ENGINE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "base/compute_device.h"
#include "model/config.h"

namespace k3 {

// Submits `request` to `scheduler` and waits for its end (ProcessEngine::Generate's contract).
// Blocks: not for the scheduler's thread, actors or gRPC handlers.
absl::StatusOr<std::vector<int32_t>> GenerateAndWait(
    GenerationScheduler& scheduler, GenerationRequest request,
    std::function<void(int32_t)> on_token = nullptr,
    std::function<void(const TokenLogprobs&)> on_logprobs = nullptr);

class ProcessEngine {
 public:
  // Loads `model_dir` for `device` and starts the scheduler with `options` (the CLI's and tests'
  // choice: a tool generating one request at a time turns the prefix cache off, a chat keeps
  // it). Unavailable for a CUDA device in a build without the CUDA Toolkit or on a machine
  // without that device; INVALID_ARGUMENT for bad options; otherwise the loader's errors.
  // `progress` (optional) sees (done, total) tensor counts while the checkpoint loads.
  static absl::StatusOr<std::unique_ptr<ProcessEngine>> Open(
      const std::string& model_dir, const ComputeDevice& device,
      const SchedulerOptions& options = SchedulerOptions(),
      const std::function<void(size_t, size_t)>& progress = nullptr);
  ~ProcessEngine();  // shuts the scheduler down before the model it steps goes

  const ModelConfig& config() const { return scheduler_->config(); }
  GenerationScheduler& scheduler() { return *scheduler_; }

  // Submits `request` and waits for its end: the new tokens (with the stop token that ended it,
  // if one did). `on_token` and `on_logprobs` (optional; with request.top_logprobs >= 0) see
  // each token as it is sampled, on the scheduler thread, and must not block. Errors: the
  // scheduler's for a bad request (INVALID_ARGUMENT), the failed step's, UNAVAILABLE once shut
  // down.
  absl::StatusOr<std::vector<int32_t>> Generate(
      GenerationRequest request, std::function<void(int32_t)> on_token = nullptr,
      std::function<void(const TokenLogprobs&)> on_logprobs = nullptr);

  // Logits of every position of `tokens` as one fresh sequence, [tokens, vocab]: one prefill,
  // or (decode) one token per step through the caches. Runs between the scheduler's steps.
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens, bool decode);

 private:
  ProcessEngine() = default;
  // What the runner reads (weights and experts; type-erased: the CPU's or the GPU's parts);
  // destroyed after the scheduler.
  std::shared_ptr<void> model_;
  std::unique_ptr<GenerationScheduler> scheduler_;
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_PROCESS_ENGINE_H_
