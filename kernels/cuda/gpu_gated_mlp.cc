#include "kernels/cuda/gpu_gated_mlp.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cublas_products.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/glu.h"

namespace k3 {
namespace {

// A BF16 matrix's rows, appended to `out` (host staging for one upload).
void AppendRows(const WeightMatrix& m, std::vector<uint16_t>* out) {
  const auto* data = static_cast<const uint16_t*>(m.data);
  out->insert(out->end(), data, data + m.rows * m.cols);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuGatedMlp>> GpuGatedMlp::Create(const GatedMlpMatrices& w,
                                                                 const GluParams& params,
                                                                 CublasProducts* products) {
  for (const WeightMatrix* m : {&w.gate, &w.up, &w.down}) {
    if (m->type != WeightType::kBf16 || m->empty()) {
      return absl::InvalidArgumentError("GpuGatedMlp: the gated MLP's weights must be BF16");
    }
  }
  if (w.up.rows != w.gate.rows || w.up.cols != w.gate.cols || w.down.cols != w.gate.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GpuGatedMlp: mismatched shapes: gate [", w.gate.rows, ", ", w.gate.cols, "], up [",
        w.up.rows, ", ", w.up.cols, "], down [", w.down.rows, ", ", w.down.cols, "]"));
  }
  std::unique_ptr<GpuGatedMlp> mlp(new GpuGatedMlp());
  mlp->products_ = products;
  mlp->stream_ = products->stream();
  mlp->params_ = params;
  mlp->d_ = w.gate.cols;
  mlp->f_ = w.gate.rows;
  mlp->d_out_ = w.down.rows;

  std::vector<uint16_t> staged;
  staged.reserve(2 * mlp->f_ * mlp->d_);
  AppendRows(w.gate, &staged);
  AppendRows(w.up, &staged);
  const size_t gate_up_bytes = staged.size() * sizeof(uint16_t);
  const size_t down_bytes = static_cast<size_t>(mlp->d_out_ * mlp->f_) * sizeof(uint16_t);
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&mlp->gate_up_, gate_up_bytes), "cudaMalloc(gate, up)");
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&mlp->down_, down_bytes), "cudaMalloc(down)");
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpy(mlp->gate_up_, staged.data(), gate_up_bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy(gate, up)");
  K3_RETURN_IF_CUDA_ERROR(cudaMemcpy(mlp->down_, w.down.data, down_bytes, cudaMemcpyHostToDevice),
                          "cudaMemcpy(down)");
  return mlp;
}

GpuGatedMlp::~GpuGatedMlp() {
  for (void* p :
       {static_cast<void*>(gate_up_), static_cast<void*>(down_), static_cast<void*>(x_bf16_),
        static_cast<void*>(gate_up_out_), static_cast<void*>(hidden_)}) {
    cudaFree(p);
  }
}

absl::Status GpuGatedMlp::Reserve(int64_t tokens) {
  if (tokens <= reserved_tokens_) return absl::OkStatus();
  DeviceAllocationEpoch().fetch_add(1);  // CUDA graphs holding the old addresses are stale
  // Frees what the stream may still read: wait for it first.
  K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                          "cudaStreamSynchronize");
  cudaFree(x_bf16_);
  cudaFree(gate_up_out_);
  cudaFree(hidden_);
  x_bf16_ = hidden_ = nullptr;
  gate_up_out_ = nullptr;
  reserved_tokens_ = 0;
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&x_bf16_, tokens * d_ * sizeof(uint16_t)), "cudaMalloc(x)");
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&gate_up_out_, tokens * 2 * f_ * sizeof(float)),
                          "cudaMalloc(gate, up out)");
  K3_RETURN_IF_CUDA_ERROR(cudaMalloc(&hidden_, tokens * f_ * sizeof(uint16_t)),
                          "cudaMalloc(hidden)");
  reserved_tokens_ = tokens;
  return absl::OkStatus();
}

absl::Status GpuGatedMlp::Run(const float* x, int64_t tokens, float* y, bool accumulate) {
  if (tokens < 1) return absl::InvalidArgumentError("GpuGatedMlp::Run: no rows");
  if (absl::Status s = Reserve(tokens); !s.ok()) return s;
  const auto rows = static_cast<int32_t>(tokens);
  K3_RETURN_IF_CUDA_ERROR(
      LaunchRoundToBf16(x, d_, rows, static_cast<int32_t>(d_), x_bf16_, d_, stream_),
      "LaunchRoundToBf16");
  if (absl::Status s = products_->Linear(gate_up_, 2 * f_, d_, x_bf16_, tokens, gate_up_out_,
                                         /*accumulate=*/false);
      !s.ok()) {
    return s;
  }
  K3_RETURN_IF_CUDA_ERROR(LaunchGluCombine(params_, gate_up_out_, gate_up_out_ + f_, 2 * f_, rows,
                                           static_cast<int32_t>(f_), hidden_, f_, stream_),
                          "LaunchGluCombine");
  return products_->Linear(down_, d_out_, f_, hidden_, tokens, y, accumulate);
}

}  // namespace k3
