#include "expert_nodes/gpu_device_experts.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "expert_nodes/gpu_expert_compute.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/device_buffer.h"
#include "model/glu_params.h"

namespace k3 {
namespace {

class GpuDeviceExperts : public DeviceExperts {
 public:
  explicit GpuDeviceExperts(int device) : device_(device) {}

  absl::Status Add(const ModelWeights& weights) override {
    if (layers_.contains(&weights)) return absl::OkStatus();
    std::map<int, std::unique_ptr<GpuExpertCompute>> layers;
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      if (!weights.layers[l].is_moe) continue;
      absl::StatusOr<std::unique_ptr<GpuExpertCompute>> compute = GpuExpertCompute::Create(
          weights.layers[l].moe.experts, GluParamsFor(weights.config), device_);
      if (!compute.ok()) {
        return absl::Status(compute.status().code(),
                            absl::StrCat("experts of model layer ", l, " on cuda:", device_, ": ",
                                         compute.status().message()));
      }
      layers[static_cast<int>(l)] = *std::move(compute);
    }
    layers_[&weights] = std::move(layers);
    return absl::OkStatus();
  }

  void Forget(const ModelWeights& weights) override { layers_.erase(&weights); }

  absl::Status Run(const ModelWeights& weights, int layer, const float* z, int64_t rows,
                   int64_t width, const std::vector<ExpertAssignment>& assignments,
                   float* out) override {
    K3_ASSIGN_OR_RETURN(GpuExpertCompute * compute, Find(weights, layer));
    return compute->Run(z, rows, width, assignments, out);
  }

  absl::Status RunDeviceRows(const ModelWeights& weights, int layer, const float* z,
                             int64_t rows, int64_t width,
                             const std::vector<ExpertAssignment>& assignments,
                             float* out) override {
    K3_ASSIGN_OR_RETURN(GpuExpertCompute * compute, Find(weights, layer));
    return compute->RunDeviceRows(z, rows, width, assignments, out);
  }

  absl::StatusOr<RowBuffers> ReserveRowBuffers(int64_t floats) override {
    K3_RETURN_IF_ERROR(UseCudaDevice(device_));
    K3_RETURN_IF_ERROR(rows_.Reserve(floats));
    K3_RETURN_IF_ERROR(answer_.Reserve(floats));
    return RowBuffers{rows_.get(), answer_.get()};
  }

  int64_t weight_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [unused, layers] : layers_) {
      for (const auto& [unused_layer, compute] : layers) bytes += compute->weight_bytes();
    }
    return bytes;
  }

 private:
  absl::StatusOr<GpuExpertCompute*> Find(const ModelWeights& weights, int layer) {
    auto held = layers_.find(&weights);
    if (held == layers_.end()) {
      return absl::FailedPreconditionError("these experts were not copied to the GPU");
    }
    auto compute = held->second.find(layer);
    if (compute == held->second.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("model layer ", layer, " has no routed experts on the GPU"));
    }
    return compute->second.get();
  }

  const int device_;
  DeviceBuffer<float> rows_, answer_;  // ReserveRowBuffers
  // By the weights' address: ExpertWorker adds and forgets them while it holds them.
  std::map<const ModelWeights*, std::map<int, std::unique_ptr<GpuExpertCompute>>> layers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceExperts>> MakeGpuDeviceExperts(int device) {
  K3_RETURN_IF_ERROR(CheckCudaDevice(device));
  return std::unique_ptr<DeviceExperts>(new GpuDeviceExperts(device));
}

}  // namespace k3
