#include "attention_nodes/cuda/gpu_step_runner.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_device.h"

namespace k3 {

absl::StatusOr<std::unique_ptr<GpuStepRunner>> GpuStepRunner::Create(
    const ModelWeights* weights, RoutedMoe* routed_moe, int device,
    const GpuRunnerCapacity& capacity, RemoteDeviceExperts* remote_experts) {
  K3_RETURN_IF_ERROR(UseCudaDevice(device));
  std::unique_ptr<GpuStepRunner> step_runner(new GpuStepRunner(
      device, remote_experts != nullptr ? std::make_unique<CudaRowOps>() : nullptr));
  DeviceExpertRunner device_experts;
  if (remote_experts != nullptr) {
    CudaRowOps* ops = step_runner->row_ops_.get();
    device_experts = [remote_experts, ops](int layer, const float* z, int64_t rows,
                                           int64_t width, const int32_t* ids,
                                           const float* weights, int32_t top_k, float* out,
                                           void* stream) {
      return remote_experts->Run(*ops, layer, z, rows, width, ids, weights, top_k, out, stream);
    };
  }
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GpuModelRunner> runner,
                      GpuModelRunner::Create(weights, routed_moe, capacity,
                                             std::move(device_experts)));
  step_runner->runner_ = std::move(runner);
  return step_runner;
}

std::unique_ptr<GpuStepRunner> GpuStepRunner::Over(std::shared_ptr<GpuModelRunner> runner,
                                                   int device) {
  std::unique_ptr<GpuStepRunner> step_runner(new GpuStepRunner(device, nullptr));
  step_runner->runner_ = std::move(runner);
  return step_runner;
}

absl::Status GpuStepRunner::MakeCurrent() const {
  if (cudaError_t error = cudaSetDevice(device_); error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device_, "): ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SequenceState>> GpuStepRunner::NewState() {
  K3_RETURN_IF_ERROR(MakeCurrent());
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GpuSequence> sequence, runner_->NewSequence());
  auto state = std::make_unique<SequenceState>();
  std::weak_ptr<GpuModelRunner> owner = runner_;
  state->device =
      std::shared_ptr<GpuSequence>(sequence.release(), [owner = std::move(owner)](GpuSequence* s) {
        if (std::shared_ptr<GpuModelRunner> runner = owner.lock()) runner->Release(s);
        delete s;
      });
  return state;
}

absl::Status GpuStepRunner::Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) {
  const absl::Time start = absl::Now();
  profile_ = StepProfile();
  K3_RETURN_IF_ERROR(MakeCurrent());
  entries_.clear();
  for (const BatchEntry& entry : batch) {
    auto* sequence = static_cast<GpuSequence*>(entry.state->device.get());
    if (sequence == nullptr) {
      return absl::InvalidArgumentError("a sequence state that GpuStepRunner did not make");
    }
    entries_.push_back({sequence, entry.tokens, entry.all_logits});
  }
  const absl::Status status = runner_->Step(entries_, logits);
  for (const BatchEntry& entry : batch) {
    entry.state->length = static_cast<const GpuSequence*>(entry.state->device.get())->length;
  }
  profile_.total = absl::Now() - start;
  return status;
}

}  // namespace k3
