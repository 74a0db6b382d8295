// GpuKdaLayer: one KDA layer (attention_nodes/forward/kda.h's KdaForwardBatch) on a GPU for BF16
// weights: the projections on cuBLAS (kernels/cuda/cublas_products.h, rows rounded to bf16), the
// fused decode kernel (kda_decode.h) or the recurrent prefill (kda_prefill.h) on fp32 states kept
// in a pool of slots in device memory, and o_proj. It agrees with the CPU layer within the bf16
// rounding of the rows that enter the products (about 1e-2 relative).
//
// Owns its device weights and the state pool; borrows the CublasProducts (and its stream), which
// must outlive it. Not thread-safe: one caller at a time (the GPU attention worker's actor).
#ifndef K3SERVE_ATTENTION_NODES_CUDA_GPU_KDA_LAYER_H_
#define K3SERVE_ATTENTION_NODES_CUDA_GPU_KDA_LAYER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention_nodes/cuda/kda_decode.h"
#include "attention_nodes/forward/kda.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/device_buffer.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3 {

class GpuKdaLayer {
 public:
  // Copies `weights` (every matrix BF16) to the current device with a pool of `slots` zero
  // states. InvalidArgument for another weight type or a config the kernels do not take (head_dim
  // other than 32, 64, 128; conv kernel above 8); Internal for a CUDA failure.
  static absl::StatusOr<std::unique_ptr<GpuKdaLayer>> Create(const ModelConfig& config,
                                                             const KdaWeights& weights,
                                                             int32_t slots,
                                                             CublasProducts* products);

  // Zeroes `slot`'s state and conv caches (a new sequence), enqueued on the products' stream.
  absl::Status ResetSlot(int32_t slot);

  // A sequence's state and conv caches into or out of `slot`: copies on the products' stream
  // (ordered after its queued work, ResetSlot included), waited for before returning.
  absl::Status UploadState(int32_t slot, const KdaState& state);
  absl::Status DownloadState(int32_t slot, KdaState* state) const;

  // One new token for each of `batch` sequences: x [batch, d] (the input_layernorm output) and
  // out [batch, d] (the mixer output, overwritten) in device memory, slots [batch] device ids of
  // distinct slots. Enqueued on the products' stream.
  absl::Status Decode(const float* x, int32_t batch, const int32_t* slots, float* out);

  // `tokens` new tokens of one sequence: x, out [tokens, d] in device memory, slot a device
  // pointer to its slot id. Enqueued on the products' stream.
  absl::Status Prefill(const float* x, int32_t tokens, const int32_t* slot, float* out);

 private:
  GpuKdaLayer(const ModelConfig& config, CublasProducts* products);
  absl::Status Upload(const KdaWeights& weights, int32_t slots);
  // The projections of `rows` rows of x into the scratch, and the launch that reads them.
  absl::StatusOr<KdaDecodeLaunch> Project(const float* x, int32_t rows);
  // out = o_proj(the kernel's output) for `rows` rows.
  absl::Status OutputProjection(int32_t rows, float* out);
  // y[rows, w.rows] = W x16 where x16 is already bf16 in the scratch.
  absl::Status Product(const DeviceBuffer<uint16_t>& w, int64_t n, int64_t k, const uint16_t* x,
                       int32_t rows, float* y);
  absl::Status RoundRows(const float* x, int32_t rows, int32_t width, uint16_t* out);

  const ModelConfig config_;
  CublasProducts* const products_;
  int64_t d_ = 0, h_ = 0, kd_ = 0, p_ = 0, window_ = 0;
  int32_t slots_ = 0;

  // BF16 weights, as stored: [rows, cols].
  DeviceBuffer<uint16_t> q_proj_, k_proj_, v_proj_, f_a_proj_, f_b_proj_, b_proj_, g_proj_,
      g_a_proj_, g_b_proj_, o_proj_;
  DeviceBuffer<float> q_conv_, k_conv_, v_conv_, dt_bias_, a_log_, o_norm_;
  DeviceBuffer<float> state_;       // [slots, H, K, V]
  DeviceBuffer<float> conv_cache_;  // [slots, 3, window, P]

  // Scratch for up to reserved_rows_ rows.
  int32_t reserved_rows_ = 0;
  DeviceBuffer<uint16_t> x16_;    // [rows, d]
  DeviceBuffer<uint16_t> low16_;  // [rows, K]: f_a's or g_a's output as bf16
  DeviceBuffer<float> low_;       // [rows, K]
  DeviceBuffer<float> q_, k_, v_, f_, gate_, kernel_out_;  // [rows, P]
  DeviceBuffer<float> beta_;                               // [rows, H]
  DeviceBuffer<uint16_t> out16_;                           // [rows, P]
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_GPU_KDA_LAYER_H_
