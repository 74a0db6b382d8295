#include "attention_nodes/cuda/gpu_kda_layer.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "attention_nodes/cuda/kda_prefill.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/glu.h"

namespace k3 {

GpuKdaLayer::GpuKdaLayer(const ModelConfig& config, CublasProducts* products)
    : config_(config), products_(products) {
  const LinearAttnConfig& la = config.linear_attn;
  d_ = config.hidden_size;
  h_ = la.num_heads;
  kd_ = la.head_dim;
  p_ = h_ * kd_;
  window_ = la.short_conv_kernel_size - 1;
}

absl::StatusOr<std::unique_ptr<GpuKdaLayer>> GpuKdaLayer::Create(const ModelConfig& config,
                                                                 const KdaWeights& weights,
                                                                 int32_t slots,
                                                                 CublasProducts* products) {
  const LinearAttnConfig& la = config.linear_attn;
  if (la.head_dim != 32 && la.head_dim != 64 && la.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuKdaLayer: head_dim ", la.head_dim, " (the kernel takes 32, 64, 128)"));
  }
  if (la.short_conv_kernel_size < 1 || la.short_conv_kernel_size > 8 || slots < 1) {
    return absl::InvalidArgumentError("GpuKdaLayer: conv kernel outside 1..8 or no slots");
  }
  std::unique_ptr<GpuKdaLayer> layer(new GpuKdaLayer(config, products));
  K3_RETURN_IF_ERROR(layer->Upload(weights, slots));
  return layer;
}

absl::Status GpuKdaLayer::Upload(const KdaWeights& w, int32_t slots) {
  const std::pair<const WeightMatrix*, DeviceBuffer<uint16_t>*> matrices[] = {
      {&w.q_proj, &q_proj_},     {&w.k_proj, &k_proj_},     {&w.v_proj, &v_proj_},
      {&w.f_a_proj, &f_a_proj_}, {&w.f_b_proj, &f_b_proj_}, {&w.b_proj, &b_proj_},
      {&w.o_proj, &o_proj_}};
  for (const auto& [matrix, buffer] : matrices) {
    K3_RETURN_IF_ERROR(UploadBf16Matrix(*matrix, "a KDA projection", buffer));
  }
  if (config_.linear_attn.use_full_rank_gate) {
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.g_proj, "g_proj", &g_proj_));
  } else {
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.g_a_proj, "g_a_proj", &g_a_proj_));
    K3_RETURN_IF_ERROR(UploadBf16Matrix(w.g_b_proj, "g_b_proj", &g_b_proj_));
  }
  for (const auto& [vector, buffer] :
       {std::pair{&w.q_conv, &q_conv_}, std::pair{&w.k_conv, &k_conv_},
        std::pair{&w.v_conv, &v_conv_}, std::pair{&w.dt_bias, &dt_bias_},
        std::pair{&w.a_log, &a_log_}, std::pair{&w.o_norm, &o_norm_}}) {
    K3_RETURN_IF_ERROR(buffer->Upload(*vector));
  }
  slots_ = slots;
  const size_t state_floats = static_cast<size_t>(slots) * h_ * kd_ * kd_;
  const size_t conv_floats = static_cast<size_t>(slots) * 3 * window_ * p_;
  K3_RETURN_IF_ERROR(state_.Reserve(state_floats));
  K3_RETURN_IF_ERROR(conv_cache_.Reserve(conv_floats > 0 ? conv_floats : 1));
  // On the products' stream (non-blocking: a legacy-stream cudaMemset would not be ordered
  // before the first kernel there).
  auto stream = static_cast<cudaStream_t>(products_->stream());
  K3_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(state_.get(), 0, state_floats * sizeof(float), stream),
                          "cudaMemsetAsync(state)");
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(conv_cache_.get(), 0, conv_floats * sizeof(float), stream),
      "cudaMemsetAsync(conv cache)");
  return absl::OkStatus();
}

absl::Status GpuKdaLayer::ResetSlot(int32_t slot) {
  if (slot < 0 || slot >= slots_) return absl::InvalidArgumentError("GpuKdaLayer: bad slot");
  auto stream = static_cast<cudaStream_t>(products_->stream());
  const size_t state_floats = h_ * kd_ * kd_, conv_floats = 3 * window_ * p_;
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(state_.get() + slot * state_floats, 0, state_floats * sizeof(float), stream),
      "cudaMemsetAsync(state)");
  K3_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(conv_cache_.get() + slot * conv_floats, 0,
                                          conv_floats * sizeof(float), stream),
                          "cudaMemsetAsync(conv cache)");
  return absl::OkStatus();
}

absl::Status GpuKdaLayer::UploadState(int32_t slot, const KdaState& state) {
  if (slot < 0 || slot >= slots_ || state.s.size() != static_cast<size_t>(h_ * kd_ * kd_)) {
    return absl::InvalidArgumentError("GpuKdaLayer::UploadState: bad slot or state size");
  }
  // On the products' stream, after whatever it has queued (a ResetSlot, a step that reads the
  // slot), then waited for: the host vectors may go as soon as this returns.
  auto stream = static_cast<cudaStream_t>(products_->stream());
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(state_.get() + slot * state.s.size(), state.s.data(),
                      state.s.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync(state)");
  const std::vector<float>* conv[3] = {&state.conv_q, &state.conv_k, &state.conv_v};
  for (int m = 0; m < 3 && window_ > 0; ++m) {
    float* at = conv_cache_.get() + (slot * 3 + m) * window_ * p_;
    K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(at, conv[m]->data(), window_ * p_ * sizeof(float),
                                            cudaMemcpyHostToDevice, stream),
                            "cudaMemcpyAsync(conv cache)");
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(UploadState)");
}

absl::Status GpuKdaLayer::DownloadState(int32_t slot, KdaState* state) const {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError("GpuKdaLayer::DownloadState: bad slot");
  }
  *state = KdaState(config_);
  // After the steps queued on the products' stream that write the slot.
  auto stream = static_cast<cudaStream_t>(products_->stream());
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(state->s.data(), state_.get() + slot * state->s.size(),
                      state->s.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(state)");
  std::vector<float>* conv[3] = {&state->conv_q, &state->conv_k, &state->conv_v};
  for (int m = 0; m < 3 && window_ > 0; ++m) {
    const float* at = conv_cache_.get() + (slot * 3 + m) * window_ * p_;
    K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(conv[m]->data(), at, window_ * p_ * sizeof(float),
                                            cudaMemcpyDeviceToHost, stream),
                            "cudaMemcpyAsync(conv cache)");
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(DownloadState)");
}

absl::Status GpuKdaLayer::RoundRows(const float* x, int32_t rows, int32_t width, uint16_t* out) {
  return CudaStatus(LaunchRoundToBf16(x, width, rows, width, out, width, products_->stream()),
                    "LaunchRoundToBf16");
}

absl::Status GpuKdaLayer::Product(const DeviceBuffer<uint16_t>& w, int64_t n, int64_t k,
                                  const uint16_t* x, int32_t rows, float* y) {
  return products_->Linear(w.get(), n, k, x, rows, y, /*accumulate=*/false);
}

absl::StatusOr<KdaDecodeLaunch> GpuKdaLayer::Project(const float* x, int32_t rows) {
  if (rows > reserved_rows_) {
    // The stream may still read the old scratch.
    K3_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(products_->stream())),
                            "cudaStreamSynchronize");
    for (DeviceBuffer<float>* b : {&q_, &k_, &v_, &f_, &gate_, &kernel_out_}) {
      K3_RETURN_IF_ERROR(b->Reserve(rows * p_));
    }
    K3_RETURN_IF_ERROR(low_.Reserve(rows * kd_));
    K3_RETURN_IF_ERROR(low16_.Reserve(rows * kd_));
    K3_RETURN_IF_ERROR(beta_.Reserve(rows * h_));
    K3_RETURN_IF_ERROR(x16_.Reserve(rows * d_));
    K3_RETURN_IF_ERROR(out16_.Reserve(rows * p_));
    reserved_rows_ = rows;
  }
  K3_RETURN_IF_ERROR(RoundRows(x, rows, static_cast<int32_t>(d_), x16_.get()));
  const uint16_t* x16 = x16_.get();
  // q, k, v, the beta logits; the decay through its low-rank pair; the output gate full-rank or
  // through its pair. Each second factor takes the first's output rounded to bf16.
  const struct {
    const DeviceBuffer<uint16_t>* w;
    int64_t n;
    float* y;
  } direct[] = {{&q_proj_, p_, q_.get()},
                {&k_proj_, p_, k_.get()},
                {&v_proj_, p_, v_.get()},
                {&b_proj_, h_, beta_.get()}};
  for (const auto& product : direct) {
    K3_RETURN_IF_ERROR(Product(*product.w, product.n, d_, x16, rows, product.y));
  }
  auto low_rank = [&](const DeviceBuffer<uint16_t>& a, const DeviceBuffer<uint16_t>& b,
                      float* y) -> absl::Status {
    K3_RETURN_IF_ERROR(Product(a, kd_, d_, x16, rows, low_.get()));
    K3_RETURN_IF_ERROR(RoundRows(low_.get(), rows, static_cast<int32_t>(kd_), low16_.get()));
    return Product(b, p_, kd_, low16_.get(), rows, y);
  };
  K3_RETURN_IF_ERROR(low_rank(f_a_proj_, f_b_proj_, f_.get()));
  K3_RETURN_IF_ERROR(config_.linear_attn.use_full_rank_gate
                         ? Product(g_proj_, p_, d_, x16, rows, gate_.get())
                         : low_rank(g_a_proj_, g_b_proj_, gate_.get()));

  const LinearAttnConfig& la = config_.linear_attn;
  KdaDecodeLaunch launch;
  launch.heads = static_cast<int32_t>(h_);
  launch.head_dim = static_cast<int32_t>(kd_);
  launch.conv_kernel = la.short_conv_kernel_size;
  launch.state = state_.get();
  launch.conv_cache = conv_cache_.get();
  launch.q = q_.get();
  launch.k = k_.get();
  launch.v = v_.get();
  launch.q_conv = q_conv_.get();
  launch.k_conv = k_conv_.get();
  launch.v_conv = v_conv_.get();
  launch.decay = f_.get();
  launch.dt_bias = dt_bias_.get();
  launch.a_log = a_log_.get();
  launch.has_lower_bound = la.gate_lower_bound.has_value() ? 1 : 0;
  launch.lower_bound = la.gate_lower_bound.value_or(0.0f);
  launch.beta_logit = beta_.get();
  launch.gate = gate_.get();
  launch.o_norm = o_norm_.get();
  launch.eps = config_.rms_norm_eps;
  launch.out = kernel_out_.get();
  return launch;
}

absl::Status GpuKdaLayer::OutputProjection(int32_t rows, float* out) {
  K3_RETURN_IF_ERROR(RoundRows(kernel_out_.get(), rows, static_cast<int32_t>(p_), out16_.get()));
  return Product(o_proj_, d_, p_, out16_.get(), rows, out);
}

absl::Status GpuKdaLayer::Decode(const float* x, int32_t batch, const int32_t* slots, float* out) {
  if (batch < 1) return absl::InvalidArgumentError("GpuKdaLayer::Decode: no sequences");
  K3_ASSIGN_OR_RETURN(KdaDecodeLaunch launch, Project(x, batch));
  launch.batch = batch;
  launch.slots = slots;
  K3_RETURN_IF_CUDA_ERROR(LaunchKdaDecode(launch, products_->stream()), "LaunchKdaDecode");
  return OutputProjection(batch, out);
}

absl::Status GpuKdaLayer::Prefill(const float* x, int32_t tokens, const int32_t* slot, float* out) {
  if (tokens < 1) return absl::InvalidArgumentError("GpuKdaLayer::Prefill: no tokens");
  K3_ASSIGN_OR_RETURN(KdaDecodeLaunch launch, Project(x, tokens));
  launch.batch = 1;
  launch.slots = slot;
  K3_RETURN_IF_CUDA_ERROR(LaunchKdaPrefill(launch, tokens, products_->stream()),
                          "LaunchKdaPrefill");
  return OutputProjection(tokens, out);
}

}  // namespace k3
