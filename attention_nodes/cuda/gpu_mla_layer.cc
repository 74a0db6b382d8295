#include "attention_nodes/cuda/gpu_mla_layer.h"

#include <cuda_runtime.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention_nodes/cuda/mla_cache.h"
#include "attention_nodes/cuda/mla_decode.h"
#include "attention_nodes/cuda/rms_norm.h"
#include "attention_nodes/forward/mla.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/glu.h"

namespace k3 {

GpuMlaLayer::GpuMlaLayer(const ModelConfig& config, CublasProducts* products)
    : config_(config), products_(products) {
  d_ = config.hidden_size;
  h_ = config.num_attention_heads;
  nope_ = config.qk_nope_head_dim;
  rope_ = config.qk_rope_head_dim;
  qhd_ = config.MlaQHeadDim();
  vd_ = config.v_head_dim;
  c_ = config.kv_lora_rank;
  width_ = config.MlaCacheWidth();
  ql_ = config.q_lora_rank.value_or(0);
}

absl::StatusOr<std::unique_ptr<GpuMlaLayer>> GpuMlaLayer::Create(const ModelConfig& config,
                                                                 const MlaWeights& weights,
                                                                 int32_t pages, int32_t page_size,
                                                                 CublasProducts* products) {
  const int64_t c = config.kv_lora_rank, width = config.MlaCacheWidth();
  if (c > kMlaDecodeMaxRank || c % 2 != 0 || width > kMlaDecodeMaxWidth || width % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuMlaLayer: kv_lora_rank ", c, " and cache rows of ", width,
                     " (the kernel takes even sizes up to 512, 576)"));
  }
  if (pages < 1 || page_size < 1) {
    return absl::InvalidArgumentError("GpuMlaLayer: no cache pages");
  }
  std::unique_ptr<GpuMlaLayer> layer(new GpuMlaLayer(config, products));
  layer->page_size_ = page_size;
  K3_RETURN_IF_ERROR(layer->Upload(weights, pages));
  return layer;
}

absl::Status GpuMlaLayer::Upload(const MlaWeights& w, int32_t pages) {
  if (config_.q_lora_rank.has_value()) {
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.q_a_proj, "q_a_proj", &q_a_proj_));
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.q_b_proj, "q_b_proj", &q_b_proj_));
    K3_RETURN_IF_ERROR(q_a_norm_.Upload(w.q_a_layernorm));
  } else {
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.q_proj, "q_proj", &q_proj_));
  }
  K3_RETURN_IF_ERROR(UploadBf16Matrix(w.kv_a_proj_with_mqa, "kv_a_proj_with_mqa", &kv_a_proj_));
  K3_RETURN_IF_ERROR(UploadBf16Matrix(w.kv_b_proj, "kv_b_proj", &kv_b_proj_));
  K3_RETURN_IF_ERROR(kv_a_norm_.Upload(w.kv_a_layernorm));
  if (config_.mla_use_output_gate) K3_RETURN_IF_ERROR(UploadBf16Matrix(w.g_proj, "g_proj", &g_proj_));
  K3_RETURN_IF_ERROR(UploadBf16Matrix(w.o_proj, "o_proj", &o_proj_));
  const size_t cache_values = static_cast<size_t>(pages) * page_size_ * width_;
  K3_RETURN_IF_ERROR(cache_.Reserve(cache_values));
  K3_RETURN_IF_CUDA_ERROR(cudaMemset(cache_.get(), 0, cache_values * sizeof(uint16_t)),
                          "cudaMemset(cache)");
  return absl::OkStatus();
}

absl::Status GpuMlaLayer::Reserve(int32_t rows) {
  if (rows <= reserved_rows_) return absl::OkStatus();
  // The stream may still read the old scratch.
  K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(products_->stream())),
                          "cudaStreamSynchronize");
  std::vector<int32_t> ids(rows);
  std::iota(ids.begin(), ids.end(), 0);
  K3_RETURN_IF_ERROR(row_ids_.Upload(ids));
  const int64_t r = rows;
  K3_RETURN_IF_ERROR(x16_.Reserve(r * d_));
  K3_RETURN_IF_ERROR(q_latent_.Reserve(r * std::max<int64_t>(ql_, 1)));
  K3_RETURN_IF_ERROR(q_latent16_.Reserve(r * std::max<int64_t>(ql_, 1)));
  K3_RETURN_IF_ERROR(q_.Reserve(r * h_ * qhd_));
  K3_RETURN_IF_ERROR(q_nope16_.Reserve(r * h_ * nope_));
  K3_RETURN_IF_ERROR(q_abs_.Reserve(r * h_ * width_));
  K3_RETURN_IF_ERROR(ckv_.Reserve(r * width_));
  K3_RETURN_IF_ERROR(gate_.Reserve(r * h_ * vd_));
  K3_RETURN_IF_ERROR(ctx_.Reserve(r * h_ * c_));
  K3_RETURN_IF_ERROR(ctx16_.Reserve(r * h_ * c_));
  K3_RETURN_IF_ERROR(o_.Reserve(r * h_ * vd_));
  K3_RETURN_IF_ERROR(o16_.Reserve(r * h_ * vd_));
  reserved_rows_ = rows;
  return absl::OkStatus();
}

absl::Status GpuMlaLayer::RoundRows(const float* x, int64_t x_stride, int64_t rows, int64_t width,
                                    uint16_t* out) {
  return CudaStatus(LaunchRoundToBf16(x, x_stride, static_cast<int32_t>(rows),
                                      static_cast<int32_t>(width), out, width, products_->stream()),
                    "LaunchRoundToBf16");
}

// q [rows, H, qhd] pre-scaled by 1/sqrt(qhd), through q-LoRA (q_a_proj, q_a_layernorm, q_b_proj)
// or q_proj; the scale rides on the last product's alpha.
absl::Status GpuMlaLayer::ProjectQuery(int32_t rows) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(qhd_));
  if (!config_.q_lora_rank.has_value()) {
    return products_->Linear(q_proj_.get(), h_ * qhd_, d_, x16_.get(), rows, q_.get(), false,
                             scale);
  }
  K3_RETURN_IF_ERROR(
      products_->Linear(q_a_proj_.get(), ql_, d_, x16_.get(), rows, q_latent_.get(), false));
  K3_RETURN_IF_CUDA_ERROR(
      LaunchRmsNorm(q_latent_.get(), ql_, rows, static_cast<int32_t>(ql_), q_a_norm_.get(),
                    kMlaLatentNormEps, q_latent_.get(), ql_, products_->stream()),
      "LaunchRmsNorm(q_a_layernorm)");
  K3_RETURN_IF_ERROR(RoundRows(q_latent_.get(), ql_, rows, ql_, q_latent16_.get()));
  return products_->Linear(q_b_proj_.get(), h_ * qhd_, ql_, q_latent16_.get(), rows, q_.get(),
                           false, scale);
}

absl::Status GpuMlaLayer::KvBProjProduct(const uint16_t* w, bool w_transposed, const uint16_t* x,
                                         int64_t k, float* y, int64_t y_width, int64_t n,
                                         int32_t rows) {
  BatchedProduct p;
  p.w = w;
  p.ldw = c_;
  p.w_head_stride = (nope_ + vd_) * c_;
  p.w_transposed = w_transposed;
  p.x = x;
  p.ldx = h_ * k;
  p.x_head_stride = k;
  p.y = y;
  p.ldy = h_ * y_width;
  p.y_head_stride = y_width;
  p.m = rows;
  p.n = n;
  p.k = k;
  p.heads = static_cast<int32_t>(h_);
  return products_->Run(p);
}

// The absorbed query q̃ = [W_K[h]ᵀ q_nope, q_pe] per head, the decode kernel over each row's
// keys, and the expansion O_h = W_V[h] õ_h into o_.
absl::Status GpuMlaLayer::Attend(const GpuMlaRows& rows) {
  const int32_t r = rows.rows;
  void* stream = products_->stream();
  K3_RETURN_IF_ERROR(RoundRows(q_.get(), qhd_, r * h_, nope_, q_nope16_.get()));
  // W_K[h]: rows [h (n + v), h (n + v) + n) of kv_b_proj, [n, c]
  K3_RETURN_IF_ERROR(KvBProjProduct(kv_b_proj_.get(), /*w_transposed=*/false, q_nope16_.get(),
                                    nope_, q_abs_.get(), width_, c_, r));
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpy2DAsync(q_abs_.get() + c_, width_ * sizeof(float), q_.get() + nope_,
                        qhd_ * sizeof(float), rope_ * sizeof(float), r * h_,
                        cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
      "cudaMemcpy2DAsync(q_pe)");

  MlaDecodeLaunch launch;
  launch.batch = r;
  launch.heads = static_cast<int32_t>(h_);
  launch.kv_lora_rank = static_cast<int32_t>(c_);
  launch.rope_dim = static_cast<int32_t>(rope_);
  launch.page_size = page_size_;
  launch.max_pages = rows.max_pages;
  launch.max_length = rows.max_length;
  launch.keys_per_split = MlaKeysPerSplit(r, launch.heads, rows.max_length);
  launch.lengths = rows.lengths;
  launch.block_table = rows.row_tables;
  launch.cache = cache_.get();
  launch.q = q_abs_.get();
  launch.out = ctx_.get();
  K3_RETURN_IF_ERROR(workspace_.Reserve(MlaDecodeWorkspaceFloats(launch)));
  launch.workspace = workspace_.get();
  K3_RETURN_IF_CUDA_ERROR(LaunchMlaDecode(launch, stream), "LaunchMlaDecode");

  K3_RETURN_IF_ERROR(RoundRows(ctx_.get(), c_, r * h_, c_, ctx16_.get()));
  // W_V[h]: the next v rows, [v, c]
  return KvBProjProduct(kv_b_proj_.get() + nope_ * c_, /*w_transposed=*/true, ctx16_.get(), c_,
                        o_.get(), vd_, vd_, r);
}

absl::Status GpuMlaLayer::Forward(const float* x, const GpuMlaRows& rows, float* out) {
  if (rows.rows < 1 || rows.max_pages < 1 || rows.max_length < 1) {
    return absl::InvalidArgumentError("GpuMlaLayer::Forward: no rows or no pages");
  }
  const int32_t r = rows.rows;
  void* stream = products_->stream();
  K3_RETURN_IF_ERROR(Reserve(r));
  K3_RETURN_IF_ERROR(RoundRows(x, d_, r, d_, x16_.get()));
  K3_RETURN_IF_ERROR(ProjectQuery(r));
  // The new cache rows: kv_a_proj, kv_a_layernorm on their c part in place, then into the pages.
  K3_RETURN_IF_ERROR(
      products_->Linear(kv_a_proj_.get(), width_, d_, x16_.get(), r, ckv_.get(), false));
  K3_RETURN_IF_CUDA_ERROR(
      LaunchRmsNorm(ckv_.get(), width_, r, static_cast<int32_t>(c_), kv_a_norm_.get(),
                    kMlaLatentNormEps, ckv_.get(), width_, stream),
      "LaunchRmsNorm(kv_a_layernorm)");
  MlaCacheWrite write;
  write.rows = r;
  write.width = static_cast<int32_t>(width_);
  write.page_size = page_size_;
  write.max_pages = rows.max_pages;
  write.new_rows = ckv_.get();
  write.sequence = row_ids_.get();  // each row's own table row
  write.position = rows.position;
  write.block_table = rows.row_tables;
  write.cache = cache_.get();
  K3_RETURN_IF_CUDA_ERROR(LaunchMlaCacheWrite(write, stream), "LaunchMlaCacheWrite");

  K3_RETURN_IF_ERROR(Attend(rows));
  if (config_.mla_use_output_gate) {
    K3_RETURN_IF_ERROR(
        products_->Linear(g_proj_.get(), h_ * vd_, d_, x16_.get(), r, gate_.get(), false));
    K3_RETURN_IF_CUDA_ERROR(LaunchMulSigmoid(gate_.get(), o_.get(), r * h_ * vd_, stream),
                            "LaunchMulSigmoid");
  }
  K3_RETURN_IF_ERROR(RoundRows(o_.get(), h_ * vd_, r, h_ * vd_, o16_.get()));
  return products_->Linear(o_proj_.get(), d_, h_ * vd_, o16_.get(), r, out, false);
}

}  // namespace k3
