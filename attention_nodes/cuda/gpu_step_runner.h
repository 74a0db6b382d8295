// GpuStepRunner: the StepRunner of an attention worker on a CUDA device (`k3serve attention
// --device cuda:N`): a GpuModelRunner, whose sequence states (KDA slots, MLA cache pages) live in
// device memory, behind the interface the GenerationScheduler batches over. A SequenceState it
// makes holds only its length and, in `device`, the GpuSequence; the slot and pages go back to the
// runner when the state is let go. The routed experts are reached through the RoutedMoe it is
// given (the router tier, for a worker).
//
// Steps always run as one batch (no ping-pong micro-batches) and record only their total time.
//
// Thread-safety: not thread-safe; the scheduler's actor is the one caller. Each call first makes
// the runner's device current on the calling thread, so the thread that creates the runner need
// not be the one that steps it. `weights` and `routed_moe` are borrowed and must outlive it.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_GPU_STEP_RUNNER_H_
#define K3SERVE_ATTENTION_NODES_CUDA_GPU_STEP_RUNNER_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention_nodes/cuda/cuda_row_ops.h"
#include "attention_nodes/cuda/gpu_model_runner.h"
#include "attention_nodes/moe_client/remote_device_experts.h"
#include "attention_nodes/forward/step_runner.h"
#include "model/weights.h"
#include "moe/routed_moe.h"

namespace k3 {

class GpuStepRunner final : public StepRunner {
 public:
  // Uploads the non-routed weights to CUDA device `device` (BF16 matrices) and sizes the state
  // pools by `capacity`. Unavailable without that device; GpuModelRunner::Create's errors. With
  // `remote_experts`, MoE layers go GPU to GPU to the expert nodes it reaches (the gate runs
  // here), and through `routed_moe` when that fails; both must outlive the runner.
  static absl::StatusOr<std::unique_ptr<GpuStepRunner>> Create(
      const ModelWeights* weights, RoutedMoe* routed_moe, int device,
      const GpuRunnerCapacity& capacity, RemoteDeviceExperts* remote_experts = nullptr);

  // A step runner over `runner`, a model runner on CUDA device `device` that someone else made
  // (GpuEngine: its routed experts on the same device); the runner's borrowed weights and
  // experts must outlive this.
  static std::unique_ptr<GpuStepRunner> Over(std::shared_ptr<GpuModelRunner> runner, int device);

  const ModelConfig& config() const override { return runner_->config(); }
  absl::StatusOr<std::unique_ptr<SequenceState>> NewState() override;
  absl::Status Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) override;
  const StepProfile& last_profile() const override { return profile_; }
  void set_ping_pong(PingPong) override {}  // one batch per step
  bool host_state() const override { return false; }

 private:
  GpuStepRunner(int device, std::unique_ptr<CudaRowOps> row_ops)
      : device_(device), row_ops_(std::move(row_ops)) {}
  absl::Status MakeCurrent() const;

  const int device_;
  // The remote experts' device operations (null without them); before runner_, which uses it.
  const std::unique_ptr<CudaRowOps> row_ops_;
  // Shared with the states' handles, which hold it weakly: a state let go after the runner is
  // gone has nothing to give back.
  std::shared_ptr<GpuModelRunner> runner_;
  StepProfile profile_;
  std::vector<GpuBatchEntry> entries_;  // per step, kept to avoid allocating
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_GPU_STEP_RUNNER_H_
