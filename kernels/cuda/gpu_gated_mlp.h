// GpuGatedMlp: GatedMlp (kernels/gated_mlp.h) on a CUDA GPU for BF16 weights: the dense FFN of
// layer 0 and the shared experts. The three products run on cuBLAS (bf16 x bf16, fp32
// accumulation and output); around them, glu.h's kernels round the input rows to bf16 and write
// act(gate) ⊙ cap(up) as bf16 for the down product. So the answer differs from GatedMlp's (fp32
// rows, fp32 hidden) by the bf16 rounding of the rows and of the hidden vector: about 2^-9
// relative per element, ~1e-3 over a row.
//
// Owns its device copy of the weights and its scratch; borrows the caller's CublasProducts (its
// cuBLAS handle, workspace and stream), which a model's ~90 MLPs (dense FFN, shared experts)
// share: one handle per GPU runner, not one per layer. Not thread-safe: one caller at a time, as
// with the CPU scratch vectors.
#ifndef K3SERVE_KERNELS_CUDA_GPU_GATED_MLP_H_
#define K3SERVE_KERNELS_CUDA_GPU_GATED_MLP_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/gated_mlp.h"

namespace k3 {

class GpuGatedMlp {
 public:
  // Copies `w` (BF16 gate and up [f, d], down [d_out, f]) to the current device; its launches go
  // on `products`' stream, and `products` must outlive the object. InvalidArgument for another
  // weight type or mismatched shapes; Internal for a CUDA failure.
  static absl::StatusOr<std::unique_ptr<GpuGatedMlp>> Create(const GatedMlpMatrices& w,
                                                             const GluParams& params,
                                                             CublasProducts* products);
  ~GpuGatedMlp();
  GpuGatedMlp(const GpuGatedMlp&) = delete;
  GpuGatedMlp& operator=(const GpuGatedMlp&) = delete;

  // Grows the scratch to `tokens` rows now, so that Run at up to that many rows allocates nothing
  // (a CUDA graph may then capture it).
  absl::Status Reserve(int64_t tokens);

  // y[t] (+)= MLP(x[t]) for t < tokens, enqueued on the stream. x: device fp32 [tokens, d] dense;
  // y: device fp32 [tokens, d_out] dense. InvalidArgument for tokens < 1.
  absl::Status Run(const float* x, int64_t tokens, float* y, bool accumulate);

  int64_t input_width() const { return d_; }
  int64_t output_width() const { return d_out_; }

 private:
  GpuGatedMlp() = default;

  void* stream_ = nullptr;           // products_'s
  CublasProducts* products_ = nullptr;  // borrowed
  GluParams params_;
  int64_t d_ = 0, f_ = 0, d_out_ = 0;
  uint16_t* gate_up_ = nullptr;  // bf16 [2f, d]: gate's rows, then up's
  uint16_t* down_ = nullptr;     // bf16 [d_out, f]
  int64_t reserved_tokens_ = 0;
  uint16_t* x_bf16_ = nullptr;    // [tokens, d]
  float* gate_up_out_ = nullptr;  // [tokens, 2f]
  uint16_t* hidden_ = nullptr;    // [tokens, f]
};

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_GPU_GATED_MLP_H_
