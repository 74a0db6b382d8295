#include "engine/gpu_engine.h"

#include <algorithm>
#include <utility>

#include <cuda_runtime.h>

#include "attention_nodes/cuda/gpu_step_runner.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_device.h"
#include "model/checkpoint.h"
#include "model/glu_params.h"

namespace k3 {
namespace {

// Whether every routed expert of the model is MXFP4 (what GpuExpertCompute takes).
bool ExpertsAreMxfp4(const ModelWeights& weights) {
  for (const LayerWeights& layer : weights.layers) {
    if (!layer.is_moe) continue;
    for (const GatedMlpWeights& expert : layer.moe.experts) {
      if (!expert.gate.empty() && expert.gate.type != WeightType::kMxfp4) return false;
    }
  }
  return true;
}

}  // namespace

GpuEngine::~GpuEngine() {
  runner_.reset();  // before the routed experts it calls
  moe_.reset();
  experts_.clear();
}

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Open(
    const std::string& model_dir, int device, const GpuRunnerCapacity& capacity,
    const std::function<void(size_t, size_t)>& progress, GpuRouting routing) {
  K3_RETURN_IF_ERROR(UseCudaDevice(device));
  K3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(model_dir));
  std::unique_ptr<GpuEngine> engine(new GpuEngine);
  engine->device_ = device;
  K3_ASSIGN_OR_RETURN(engine->weights_,
                      LoadWeights(std::shared_ptr<const Checkpoint>(std::move(checkpoint)),
                                  WeightSelection::All(), progress));
  const ModelWeights& weights = *engine->weights_;
  ExpertRunner on_gpu;
  DeviceExpertRunner on_device;
  if (ExpertsAreMxfp4(weights)) {
    const GluParams glu = GluParamsFor(weights.config);
    engine->experts_.resize(weights.layers.size());
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      if (!weights.layers[l].is_moe) continue;
      K3_ASSIGN_OR_RETURN(engine->experts_[l],
                          GpuExpertCompute::Create(weights.layers[l].moe.experts, glu, device));
    }
    on_gpu = [experts = &engine->experts_](int layer, const float* z, int64_t rows, int64_t width,
                                           const std::vector<ExpertAssignment>& assignments,
                                           float* out) {
      return (*experts)[layer]->Run(z, rows, width, assignments, out);
    };
    if (routing == GpuRouting::kDevice) {
      on_device = [self = engine.get()](int layer, const float* z, int64_t rows, int64_t width,
                                        const int32_t* ids, const float* weights, int32_t top_k,
                                        float* out, void* stream) -> absl::Status {
        if (self->observer_) {
          self->observed_.resize(static_cast<size_t>(rows * top_k));
          K3_RETURN_IF_CUDA_ERROR(
              cudaMemcpyAsync(self->observed_.data(), ids, sizeof(int32_t) * rows * top_k,
                              cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
              "cudaMemcpyAsync(observed expert ids)");
          K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                                  "cudaStreamSynchronize(observed expert ids)");
          self->observer_(layer, self->observed_, top_k);
        }
        return self->experts_[layer]->RunOnDevice(z, rows, width, ids, weights, top_k, out,
                                                  stream);
      };
    }
  }
  if (on_device == nullptr) {
    engine->moe_ = std::make_unique<LocalRoutedMoe>(engine->weights_.get(), std::move(on_gpu));
  }
  K3_ASSIGN_OR_RETURN(engine->runner_,
                      GpuModelRunner::Create(engine->weights_.get(), engine->moe_.get(), capacity,
                                             std::move(on_device)));
  return engine;
}

void GpuEngine::SetRoutingObserver(RoutingObserver observer) {
  observer_ = std::move(observer);
  if (moe_ == nullptr) return;  // device routing: on_device calls observer_
  if (!observer_) {
    moe_->set_routing_hook(nullptr);
    return;
  }
  moe_->set_routing_hook([this](int layer, Routing* routing) {
    observer_(layer, routing->experts, routing->top_k);
  });
}

absl::Status GpuEngine::EnableCudaGraphs() {
  if (observer_) {
    return absl::FailedPreconditionError("CUDA graphs with a routing observer (it synchronizes)");
  }
  if (absl::Status s = runner_->SetCudaGraphs(true); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::StepInto(GpuSequence* sequence, absl::Span<const int32_t> tokens,
                                 bool all_logits, std::vector<float>* logits) {
  std::vector<float> step;
  const GpuBatchEntry entry{sequence, tokens, all_logits};
  K3_RETURN_IF_ERROR(runner_->Step({entry}, &step));
  logits->insert(logits->end(), step.begin(), step.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> GpuEngine::Logits(const std::vector<int32_t>& tokens,
                                                     bool decode) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GpuSequence> sequence, runner_->NewSequence());
  std::vector<float> logits;
  absl::Status status;
  if (!decode) {
    status = StepInto(sequence.get(), tokens, /*all_logits=*/true, &logits);
  } else {
    for (size_t t = 0; t < tokens.size() && status.ok(); ++t) {
      status = StepInto(sequence.get(), absl::MakeConstSpan(&tokens[t], 1), true, &logits);
    }
  }
  runner_->Release(sequence.get());
  if (!status.ok()) return status;
  return logits;
}

std::unique_ptr<StepRunner> GpuEngine::NewStepRunner() {
  return GpuStepRunner::Over(runner_, device_);
}

}  // namespace k3
