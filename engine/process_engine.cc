#include "engine/process_engine.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "attention_nodes/forward/model_runner.h"
#include "engine/local_routed_moe.h"
#include "model/weights.h"
#ifdef K3SERVE_CUDA
#include "engine/gpu_engine.h"
#endif

namespace k3 {
namespace {

// What a CPU runner reads.
struct CpuModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<LocalRoutedMoe> moe;  // reads weights
};

// Collects one request's tokens for Generate, which waits for OnFinish.
class WaitingSink : public GenerationSink {
 public:
  WaitingSink(std::function<void(int32_t)> on_token,
              std::function<void(const TokenLogprobs&)> on_logprobs)
      : on_token_(std::move(on_token)), on_logprobs_(std::move(on_logprobs)) {}

  void OnToken(int32_t token, int, int) override {
    tokens_.push_back(token);
    if (on_token_) on_token_(token);
  }
  void OnLogprobs(const TokenLogprobs& logprobs) override {
    if (on_logprobs_) on_logprobs_(logprobs);
  }
  void OnFinish(const GenerationResult& result) override {
    result_ = result;
    done_.Notify();
  }

  absl::StatusOr<std::vector<int32_t>> Wait() {
    done_.WaitForNotification();
    if (result_.reason == FinishReason::kError) return result_.status;
    if (result_.reason == FinishReason::kCancelled) {
      return result_.status.ok() ? absl::CancelledError(result_.message) : result_.status;
    }
    return std::move(tokens_);
  }

 private:
  const std::function<void(int32_t)> on_token_;
  const std::function<void(const TokenLogprobs&)> on_logprobs_;
  std::vector<int32_t> tokens_;  // scheduler thread until done_
  GenerationResult result_;
  absl::Notification done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessEngine>> ProcessEngine::Open(
    const std::string& model_dir, const ComputeDevice& device, const SchedulerOptions& options,
    const std::function<void(size_t, size_t)>& progress) {
  K3_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<ProcessEngine> engine(new ProcessEngine);
  std::unique_ptr<StepRunner> runner;
  if (device.cuda < 0) {
    auto model = std::make_shared<CpuModel>();
    K3_ASSIGN_OR_RETURN(model->weights, LoadWeights(model_dir, WeightSelection::All(), progress));
    model->moe = std::make_unique<LocalRoutedMoe>(model->weights.get());
    runner = std::make_unique<ModelRunner>(model->weights.get(), model->moe.get());
    engine->model_ = std::move(model);
  } else {
#ifdef K3SERVE_CUDA
    GpuRunnerCapacity capacity;
    capacity.sequences = options.max_sequences;
    K3_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> gpu,
                        GpuEngine::Open(model_dir, device.cuda, capacity, progress));
    runner = gpu->NewStepRunner();
    engine->model_ = std::shared_ptr<GpuEngine>(std::move(gpu));
#else
    return absl::UnavailableError(
        "--device cuda: this k3serve was built without the CUDA Toolkit (docs/GPU.md)");
#endif
  }
  engine->scheduler_ =
      std::make_unique<GenerationScheduler>(std::move(runner), options, /*metrics=*/nullptr);
  return engine;
}

ProcessEngine::~ProcessEngine() {
  if (scheduler_ != nullptr) scheduler_->Shutdown();
  scheduler_.reset();  // its runner reads model_
}

absl::StatusOr<std::vector<int32_t>> GenerateAndWait(
    GenerationScheduler& scheduler, GenerationRequest request,
    std::function<void(int32_t)> on_token,
    std::function<void(const TokenLogprobs&)> on_logprobs) {
  auto sink = std::make_shared<WaitingSink>(std::move(on_token), std::move(on_logprobs));
  K3_RETURN_IF_ERROR(scheduler.Submit(std::move(request), sink).status());
  return sink->Wait();
}

absl::StatusOr<std::vector<int32_t>> ProcessEngine::Generate(
    GenerationRequest request, std::function<void(int32_t)> on_token,
    std::function<void(const TokenLogprobs&)> on_logprobs) {
  return GenerateAndWait(*scheduler_, std::move(request), std::move(on_token),
                         std::move(on_logprobs));
}

absl::StatusOr<std::vector<float>> ProcessEngine::Logits(const std::vector<int32_t>& tokens,
                                                         bool decode) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  std::vector<float> all;
  K3_RETURN_IF_ERROR(scheduler_->WithRunner([&](StepRunner& runner) -> absl::Status {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<SequenceState> state, runner.NewState());
    std::vector<float> step;
    const size_t chunk = decode ? 1 : tokens.size();
    for (size_t t = 0; t < tokens.size(); t += chunk) {
      const BatchEntry entry{state.get(), absl::MakeConstSpan(tokens).subspan(t, chunk),
                             /*all_logits=*/true};
      K3_RETURN_IF_ERROR(runner.Step({entry}, &step));
      all.insert(all.end(), step.begin(), step.end());
    }
    return absl::OkStatus();
  }));
  return all;
}

}  // namespace k3
