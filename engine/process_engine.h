// ProcessEngine: the single-process engine a command asks for with `--device` (the syntax of
// `k3serve expert --device`: cpu, cuda or cuda:N): LocalEngine on the CPU, or GpuEngine on that
// CUDA device where the build has the CUDA Toolkit. `k3serve generate` and `logits` use it.
#ifndef K3SERVE_ENGINE_PROCESS_ENGINE_H_
#define K3SERVE_ENGINE_PROCESS_ENGINE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/generation.h"
#include "expert_nodes/device_experts.h"
#include "model/config.h"

namespace k3 {

class ProcessEngine {
 public:
  virtual ~ProcessEngine() = default;
  virtual const ModelConfig& config() const = 0;
  // LocalEngine::Logits and LocalEngine::Generate's contracts.
  virtual absl::StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& tokens,
                                                    bool decode) = 0;
  virtual absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                        const GenerateOptions& options) = 0;
};

// Loads `model_dir` for `device`. Unavailable for a CUDA device in a build without the CUDA
// Toolkit or on a machine without that device; otherwise the engine's own errors.
absl::StatusOr<std::unique_ptr<ProcessEngine>> OpenProcessEngine(
    const std::string& model_dir, const ComputeDevice& device,
    const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace k3

#endif  // K3SERVE_ENGINE_PROCESS_ENGINE_H_
