// GpuMlaLayer: one MLA layer (attention_nodes/forward/mla.h's MlaForwardBatch) on a GPU for BF16
// weights, in the absorbed form for every token, prefill included: the projections and the per-head
// absorption products on cuBLAS (kernels/cuda/cublas_products.h, rows rounded to bf16), the latent
// norms (rms_norm.h), the new rows into the paged bf16 cache (mla_cache.h), the fp32 decode kernel
// (mla_decode.h) with one query row per new token, the value expansion, the output gate and o_proj.
// A prefill chunk is causal because each of its rows attends to its own length (position + 1) of a
// cache its chunk has just been written into. It agrees with the CPU layer within bf16 rounding
// (the cache rows, and the rows that enter the products): about 1e-2.
//
// Owns its device weights and the cache's page pool; the caller assigns pages to sequences (the
// tables in GpuMlaRows). Borrows the CublasProducts (and its stream), which must outlive it. Not
// thread-safe: one caller at a time (the GPU attention worker's actor).
#ifndef K3SERVE_ATTENTION_NODES_CUDA_GPU_MLA_LAYER_H_
#define K3SERVE_ATTENTION_NODES_CUDA_GPU_MLA_LAYER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/device_buffer.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3 {

// A call's new tokens, one per row of x, in device memory. Rows of one sequence may come in any
// order within a call; every row's position is below the cache pages its table holds.
struct GpuMlaRows {
  int32_t rows = 0;
  int32_t max_pages = 0;                // the tables' row length
  int32_t max_length = 0;               // >= every lengths[r]
  const int32_t* position = nullptr;    // [rows]: the token's index in its sequence
  const int32_t* lengths = nullptr;     // [rows]: position + 1, the keys the row attends to
  const int32_t* row_tables = nullptr;  // [rows, max_pages]: the row's sequence's pages, in order
};

class GpuMlaLayer {
 public:
  // Copies `weights` (every matrix BF16) to the current device, with a zeroed cache of `pages`
  // pages of `page_size` tokens. InvalidArgument for another weight type or dims the decode
  // kernel does not take (kv_lora_rank above 512 or odd, a cache row above 576 or odd); Internal
  // for a CUDA failure.
  static absl::StatusOr<std::unique_ptr<GpuMlaLayer>> Create(const ModelConfig& config,
                                                             const MlaWeights& weights,
                                                             int32_t pages, int32_t page_size,
                                                             CublasProducts* products);

  // out[r] = the mixer's output for the new token x[r] (x, out: [rows, d] device fp32, out
  // overwritten), writing each token's cache row first. Enqueued on the products' stream.
  absl::Status Forward(const float* x, const GpuMlaRows& rows, float* out);

  int32_t page_size() const { return page_size_; }

 private:
  GpuMlaLayer(const ModelConfig& config, CublasProducts* products);
  absl::Status Upload(const MlaWeights& weights, int32_t pages);
  absl::Status Reserve(int32_t rows);
  absl::Status RoundRows(const float* x, int64_t x_stride, int64_t rows, int64_t width,
                         uint16_t* out);
  absl::Status ProjectQuery(int32_t rows);
  // Enqueues, for `rows` rows and every head h, y[:, h, 0:n] = x[:, h, 0:k] · W[h] (W[h] stored
  // [k, n]), or x[:, h, 0:k] · W[h]ᵀ when w_transposed ([n, k]): W[h] starts at `w` in head h's
  // share of kv_b_proj (nope + v rows of c), x holds k and y y_width values per row and head.
  absl::Status KvBProjProduct(const uint16_t* w, bool w_transposed, const uint16_t* x, int64_t k,
                              float* y, int64_t y_width, int64_t n, int32_t rows);
  absl::Status Attend(const GpuMlaRows& rows);

  const ModelConfig config_;
  CublasProducts* const products_;
  int64_t d_ = 0, h_ = 0, nope_ = 0, rope_ = 0, qhd_ = 0, vd_ = 0, c_ = 0, width_ = 0, ql_ = 0;
  int32_t page_size_ = 0;

  DeviceBuffer<uint16_t> q_a_proj_, q_b_proj_, q_proj_, kv_a_proj_, kv_b_proj_, g_proj_, o_proj_;
  DeviceBuffer<float> q_a_norm_, kv_a_norm_;
  DeviceBuffer<uint16_t> cache_;  // [pages, page_size, c + r] bf16

  // Scratch for up to reserved_rows_ rows.
  int32_t reserved_rows_ = 0;
  DeviceBuffer<int32_t> row_ids_;  // 0, 1, ...: a row's own table row
  DeviceBuffer<uint16_t> x16_, q_latent16_, q_nope16_, ctx16_, o16_;
  DeviceBuffer<float> q_latent_, q_, ckv_, gate_, q_abs_, ctx_, o_, workspace_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_GPU_MLA_LAYER_H_
