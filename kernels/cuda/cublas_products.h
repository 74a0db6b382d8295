// Matrix products on a GPU through cuBLAS for the GPU layers: bf16 operands (weights as stored,
// activations rounded by glu.h's LaunchRoundToBf16), fp32 accumulation and fp32 results, all
// matrices row-major, as kernels/matmul.h's MatMul lays them out.
//
// Owns a cuBLAS handle bound to one stream; every product is enqueued there. Not thread-safe: one
// caller at a time (cuBLAS handles are not).
#ifndef K3SERVE_KERNELS_CUDA_CUBLAS_PRODUCTS_H_
#define K3SERVE_KERNELS_CUDA_CUBLAS_PRODUCTS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace k3 {

// One product per head (or one product: heads = 1): y_h[m, n] (+)= alpha · x_h[m, k] · op(W_h),
// where op(W_h) = W_hᵀ for W_h stored [n, k] (w_transposed, as nn.Linear stores weights) or W_h for
// W_h stored [k, n]. Element (i, j) of x_h is x[h * x_head_stride + i * ldx + j]; likewise for W_h
// (row stride ldw) and y_h (ldy). Every pointer is a device pointer.
struct BatchedProduct {
  const uint16_t* w = nullptr;  // bf16
  int64_t ldw = 0, w_head_stride = 0;
  bool w_transposed = true;
  const uint16_t* x = nullptr;  // bf16
  int64_t ldx = 0, x_head_stride = 0;
  float* y = nullptr;
  int64_t ldy = 0, y_head_stride = 0;
  int64_t m = 0, n = 0, k = 0;
  int32_t heads = 1;
  float alpha = 1.0f;
  bool accumulate = false;
};

class CublasProducts {
 public:
  // A handle on `stream` (a cudaStream_t; nullptr for the legacy stream), which must outlive the
  // object. Internal with cuBLAS's reason when it cannot be created.
  static absl::StatusOr<std::unique_ptr<CublasProducts>> Create(void* stream);
  ~CublasProducts();
  CublasProducts(const CublasProducts&) = delete;
  CublasProducts& operator=(const CublasProducts&) = delete;

  // Enqueues p. InvalidArgument for sizes below 1, above cuBLAS's int range, or a leading
  // dimension smaller than its matrix's row; Internal with cuBLAS's reason when it fails.
  absl::Status Run(const BatchedProduct& p);

  // y[m, n] (+)= alpha · x[m, k] · W[n, k]ᵀ, dense rows: MatMul's product.
  absl::Status Linear(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x, int64_t m,
                      float* y, bool accumulate, float alpha = 1.0f);

  // y[i] += x[i] for i < n (fp32, dense): a residual add.
  absl::Status Add(const float* x, float* y, int64_t n);

  void* stream() const { return stream_; }

 private:
  CublasProducts() = default;

  void* stream_ = nullptr;
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_CUBLAS_PRODUCTS_H_
