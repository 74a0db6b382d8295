// GpuExpertCompute: RunExperts (expert_nodes/expert_compute.h) on a CUDA GPU, for MXFP4 experts.
//
// Create copies one MoE layer's hosted experts into device memory once, repacked for the kernels
// (kernels/cuda/mxfp4_gpu_layout.h: the same bytes, permuted). Run takes the rows and assignments
// of a call, groups them by expert as RunExperts does, rounds the rows to bf16, and runs the two
// expert launches of kernels/cuda/moe_mxfp4.h (all of the call's experts in each) on the object's
// stream, then copies the answer back. The answer matches RunExperts within the rounding of the
// activations to bf16 (kernels/cuda/moe_mxfp4.cu says where it rounds).
//
// Owns its device memory and stream. Not thread-safe: one caller at a time (an expert worker's
// actor), as with ExpertScratch.
#ifndef K3SERVE_EXPERT_NODES_GPU_EXPERT_COMPUTE_H_
#define K3SERVE_EXPERT_NODES_GPU_EXPERT_COMPUTE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/moe_mxfp4.h"
#include "kernels/gated_mlp.h"
#include "model/weights.h"
#include "moe/expert_assignment.h"

namespace k3 {

class GpuExpertCompute {
 public:
  // experts: indexed by global expert id, empty entries not hosted (as RunExperts takes them);
  // every hosted one MXFP4 with gate/up [f, d] and down [d, f], d and f multiples of 64.
  // InvalidArgument for another dtype or shape, Unavailable without a usable `device`.
  static absl::StatusOr<std::unique_ptr<GpuExpertCompute>> Create(
      const std::vector<GatedMlpWeights>& experts, const GluParams& params, int device);
  ~GpuExpertCompute();
  GpuExpertCompute(const GpuExpertCompute&) = delete;
  GpuExpertCompute& operator=(const GpuExpertCompute&) = delete;

  // RunExperts' contract: z [rows, width] fp32, out [rows, width] overwritten; InvalidArgument for
  // an out-of-range row, an expert not hosted here or a width other than the experts' d.
  absl::Status Run(const float* z, int64_t rows, int64_t width,
                   const std::vector<ExpertAssignment>& assignments, float* out);

  // Run with z and out in this object's device memory (rows that arrived on a device channel, an
  // answer to send on one); the assignments stay on the host and are grouped there as Run groups
  // them. Returns when out is written (the stream synchronized), so another stream may read it.
  absl::Status RunDeviceRows(const float* z, int64_t rows, int64_t width,
                             const std::vector<ExpertAssignment>& assignments, float* out);

  // The same with everything in device memory, enqueued on the caller's `stream` (a
  // cudaStream_t on this object's device), for a step whose router runs on the GPU
  // (kernels/cuda/moe_gate.h): z [rows, width] fp32, the routing ids and weights [rows, top_k]
  // (every row's top_k distinct global expert ids), out [rows, width] fp32, overwritten. The
  // routing is grouped on the device (kernels/cuda/moe_group.h), so nothing passes through the host
  // and the call can be captured in a CUDA graph once a call of the same rows and top_k has grown
  // the scratch (the first call may allocate). InvalidArgument for a width other than the
  // experts' d, sizes below 1, or a layer that does not host every expert of the model (ids are
  // not checked on the host; ids outside [0, num_experts) are dropped on the device).
  absl::Status RunOnDevice(const float* z, int64_t rows, int64_t width, const int32_t* ids,
                           const float* weights, int32_t top_k, float* out, void* stream);

  // Device bytes of the packed weights.
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  // Device memory grown to the largest call so far.
  struct DeviceBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  GpuExpertCompute() = default;
  absl::Status Upload(const std::vector<GatedMlpWeights>& experts);
  absl::Status Reserve(DeviceBuffer& buffer, size_t bytes);
  // Fills the host staging vectors from the call of `rows` rows (x_host_ only when z is on the
  // host); returns the chunk size (8, 16 or 32 tokens).
  int32_t Stage(const float* z, bool z_on_device, int64_t rows,
                const std::vector<ExpertAssignment>& assignments);
  // The call's rows and experts against this worker's width and table.
  absl::Status CheckAssignments(int64_t rows, int64_t width,
                                const std::vector<ExpertAssignment>& assignments) const;
  // The grouped kernels' arguments over the staged buffers, writing `rows` rows of out (on the
  // device).
  MoeMxfp4Launch StagedLaunch(int32_t chunk_tokens, int64_t rows, float* out) const;
  // Run and RunDeviceRows: z and out on the host or on the device.
  absl::Status RunGrouped(const float* z, bool on_device, int64_t rows, int64_t width,
                          const std::vector<ExpertAssignment>& assignments, float* out);

  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  int64_t width_ = 0, hidden_ = 0, weight_bytes_ = 0;
  GpuGluParams glu_;
  std::vector<int32_t> table_index_;  // global expert id -> index into table_, -1 if not hosted
  void* weights_ = nullptr;           // every hosted expert's packed bytes, one allocation
  DeviceBuffer table_, x_, h_, slot_row_, slot_weight_, slot_out_, row_slots_, chunks_, out_;
  DeviceBuffer table_index_device_;  // table_index_ on the device (RunOnDevice)
  bool hosts_all_ = false;           // every expert id has weights here
  // Host staging for a call.
  std::vector<uint16_t> x_host_;
  std::vector<int32_t> slot_row_host_;
  std::vector<float> slot_weight_host_;
  std::vector<int32_t> row_slots_host_;  // [rows, row_slots_per_row_], -1 padded
  int32_t row_slots_per_row_ = 0;
  std::vector<MoeChunk> chunks_host_;
};

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_GPU_EXPERT_COMPUTE_H_
