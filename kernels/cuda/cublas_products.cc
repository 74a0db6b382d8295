#include "kernels/cuda/cublas_products.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusString(status)));
}

bool FitsInt(int64_t v) { return v >= 1 && v <= std::numeric_limits<int>::max(); }

}  // namespace

absl::StatusOr<std::unique_ptr<CublasProducts>> CublasProducts::Create(void* stream) {
  std::unique_ptr<CublasProducts> products(new CublasProducts());
  products->stream_ = stream;
  cublasHandle_t handle = nullptr;
  if (absl::Status s = CublasStatus(cublasCreate(&handle), "cublasCreate"); !s.ok()) return s;
  products->handle_ = handle;
  if (absl::Status s = CublasStatus(cublasSetStream(handle, static_cast<cudaStream_t>(stream)),
                                    "cublasSetStream");
      !s.ok()) {
    return s;
  }
  return products;
}

CublasProducts::~CublasProducts() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

absl::Status CublasProducts::Run(const BatchedProduct& p) {
  const int64_t w_row = p.w_transposed ? p.k : p.n;
  if (!FitsInt(p.m) || !FitsInt(p.n) || !FitsInt(p.k) || p.heads < 1 || !FitsInt(p.ldw) ||
      !FitsInt(p.ldx) || !FitsInt(p.ldy) || p.ldw < w_row || p.ldx < p.k || p.ldy < p.n) {
    return absl::InvalidArgumentError(absl::StrCat("CublasProducts: bad product shape m ", p.m,
                                                   " n ", p.n, " k ", p.k, " heads ", p.heads));
  }
  // Row-major y_h = x_h op(W_h) is column-major y_hᵀ = op(W_h)ᵀ x_hᵀ: cuBLAS's A is W_h as
  // stored (column-major [k, n] when stored [n, k] row-major, so transposed back), B is x_h as
  // stored (column-major [k, m]), C is y_h as stored (column-major [n, m]).
  const float beta = p.accumulate ? 1.0f : 0.0f;
  return CublasStatus(
      cublasGemmStridedBatchedEx(
          static_cast<cublasHandle_t>(handle_), p.w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
          CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k),
          &p.alpha, p.w, CUDA_R_16BF, static_cast<int>(p.ldw), p.w_head_stride, p.x, CUDA_R_16BF,
          static_cast<int>(p.ldx), p.x_head_stride, &beta, p.y, CUDA_R_32F, static_cast<int>(p.ldy),
          p.y_head_stride, p.heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

absl::Status CublasProducts::Linear(const uint16_t* w, int64_t n, int64_t k, const uint16_t* x,
                                    int64_t m, float* y, bool accumulate, float alpha) {
  return Run({.w = w,
              .ldw = k,
              .x = x,
              .ldx = k,
              .y = y,
              .ldy = n,
              .m = m,
              .n = n,
              .k = k,
              .alpha = alpha,
              .accumulate = accumulate});
}

absl::Status CublasProducts::Add(const float* x, float* y, int64_t n) {
  if (!FitsInt(n)) return absl::InvalidArgumentError(absl::StrCat("CublasProducts::Add: n ", n));
  const float one = 1.0f;
  return CublasStatus(
      cublasSaxpy(static_cast<cublasHandle_t>(handle_), static_cast<int>(n), &one, x, 1, y, 1),
      "cublasSaxpy");
}

}  // namespace k3
