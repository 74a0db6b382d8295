#include "engine/process_engine.h"

#include <utility>

#include "base/status_macros.h"
#include "engine/local_engine.h"
#ifdef K3SERVE_CUDA
#include "engine/gpu_engine.h"
#endif

namespace k3 {
namespace {

// LocalEngine or GpuEngine behind the one interface.
template <typename Engine>
class EngineOf : public ProcessEngine {
 public:
  explicit EngineOf(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
  const ModelConfig& config() const override { return engine_->config(); }
  absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens,
                                            bool decode) override {
    return engine_->Logits(tokens, decode);
  }
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const GenerateOptions& options) override {
    return engine_->Generate(prompt, options);
  }

 private:
  std::unique_ptr<Engine> engine_;
};

template <typename Engine>
std::unique_ptr<ProcessEngine> Wrap(std::unique_ptr<Engine> engine) {
  return std::make_unique<EngineOf<Engine>>(std::move(engine));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessEngine>> OpenProcessEngine(
    const std::string& model_dir, const ComputeDevice& device,
    const std::function<void(size_t, size_t)>& progress) {
  if (device.cuda < 0) {
    K3_ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine,
                        LocalEngine::Open(model_dir, progress));
    return Wrap(std::move(engine));
  }
#ifdef K3SERVE_CUDA
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> engine,
                      GpuEngine::Open(model_dir, device.cuda, GpuRunnerCapacity{}, progress));
  return Wrap(std::move(engine));
#else
  return absl::UnavailableError(
      "--device cuda: this k3serve was built without the CUDA Toolkit (docs/GPU.md)");
#endif
}

}  // namespace k3
