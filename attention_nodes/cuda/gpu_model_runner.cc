#include "attention_nodes/cuda/gpu_model_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention_nodes/cuda/attn_res.h"
#include "attention_nodes/cuda/rms_norm.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/glu.h"
#include "model/glu_params.h"
#include "kernels/cuda/moe_gate.h"
#include "glog/logging.h"

namespace k3 {
namespace {

absl::StatusOr<std::unique_ptr<GpuGatedMlp>> UploadMlp(const GatedMlpWeights& w,
                                                       const GluParams& glu,
                                                       CublasProducts* products) {
  return GpuGatedMlp::Create(GatedMlpMatrices{w.gate, w.up, w.down}, glu, products);
}

}  // namespace

GpuModelRunner::GpuModelRunner(const ModelWeights* weights, RoutedMoe* routed_moe,
                               DeviceExpertRunner device_experts)
    : weights_(weights), routed_moe_(routed_moe), device_experts_(std::move(device_experts)) {}

GpuModelRunner::~GpuModelRunner() {
  // Everything that enqueues on the stream or holds its cuBLAS handle goes before the stream.
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (auto& [key, graph] : graphs_) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph.exec));
  }
  cudaFreeHost(pinned_sources_);
  layers_.clear();
  products_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::StatusOr<std::unique_ptr<GpuModelRunner>> GpuModelRunner::Create(
    const ModelWeights* weights, RoutedMoe* routed_moe, const GpuRunnerCapacity& capacity,
    DeviceExpertRunner device_experts) {
  if (capacity.sequences < 1 || capacity.cache_pages < 1 || capacity.page_size < 1) {
    return absl::InvalidArgumentError("GpuModelRunner: capacity needs sequences and pages");
  }
  if (device_experts == nullptr && routed_moe == nullptr) {
    return absl::InvalidArgumentError("GpuModelRunner: no way to the routed experts");
  }
  const ModelConfig& config = weights->config;
  if (device_experts != nullptr &&
      (config.num_experts > kMoeGateMaxExperts || config.num_experts_per_token > kMoeGateMaxTopK)) {
    return absl::InvalidArgumentError(absl::StrCat("GpuModelRunner: the device gate takes at most ",
                                                   kMoeGateMaxExperts, " experts and top ",
                                                   kMoeGateMaxTopK));
  }
  std::unique_ptr<GpuModelRunner> runner(
      new GpuModelRunner(weights, routed_moe, std::move(device_experts)));
  K3_RETURN_IF_ERROR(runner->Build(capacity));
  return runner;
}

absl::Status GpuModelRunner::Build(const GpuRunnerCapacity& capacity) {
  const ModelConfig& config = weights_->config;
  cudaStream_t stream = nullptr;
  K3_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          "cudaStreamCreate");
  stream_ = stream;
  K3_ASSIGN_OR_RETURN(products_, CublasProducts::Create(stream_));
  const GluParams glu = GluParamsFor(config);
  page_size_ = capacity.page_size;
  layers_.resize(config.num_hidden_layers);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const LayerWeights& lw = weights_->layers[l];
    Layer& layer = layers_[l];
    K3_RETURN_IF_ERROR(layer.input_norm.Upload(lw.input_layernorm));
    K3_RETURN_IF_ERROR(layer.post_norm.Upload(lw.post_attention_layernorm));
    if (config.HasAttnRes()) {
      K3_RETURN_IF_ERROR(layer.attn_res_proj.Upload(lw.attn_res_proj));
      K3_RETURN_IF_ERROR(layer.attn_res_norm.Upload(lw.attn_res_norm));
      K3_RETURN_IF_ERROR(layer.mlp_res_proj.Upload(lw.mlp_res_proj));
      K3_RETURN_IF_ERROR(layer.mlp_res_norm.Upload(lw.mlp_res_norm));
    }
    if (lw.is_kda) {
      K3_ASSIGN_OR_RETURN(layer.kda,
                          GpuKdaLayer::Create(config, lw.kda, capacity.sequences, products_.get()));
    } else {
      K3_ASSIGN_OR_RETURN(layer.mla, GpuMlaLayer::Create(config, lw.mla, capacity.cache_pages,
                                                         capacity.page_size, products_.get()));
    }
    if (!lw.is_moe) {
      K3_ASSIGN_OR_RETURN(layer.mlp, UploadMlp(lw.dense_mlp, glu, products_.get()));
    } else {
      K3_ASSIGN_OR_RETURN(layer.mlp, UploadMlp(lw.moe.shared, glu, products_.get()));
      if (config.IsLatentMoe()) {
        K3_RETURN_IF_ERROR(UploadBf16Matrix(lw.moe.latent_up, "latent_up", &layer.latent_up));
      }
      if (device_experts_ != nullptr) K3_RETURN_IF_ERROR(UploadRouter(lw.moe, &layer));
    }
  }
  K3_RETURN_IF_ERROR(UploadBf16Matrix(weights_->lm_head, "lm_head", &lm_head_));
  K3_RETURN_IF_ERROR(final_norm_.Upload(weights_->final_norm));
  if (config.HasAttnRes()) {
    K3_RETURN_IF_ERROR(output_res_proj_.Upload(weights_->output_attn_res_proj));
    K3_RETURN_IF_ERROR(output_res_norm_.Upload(weights_->output_attn_res_norm));
  }
  // At most two depth reads per layer and one for the output, of at most every layer's block
  // and the prefix each.
  source_slices_ = 2 * config.num_hidden_layers + 1;
  source_width_ = config.num_hidden_layers + 2;
  const size_t sources = static_cast<size_t>(source_slices_) * source_width_;
  K3_RETURN_IF_CUDA_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&pinned_sources_), sources * sizeof(const float*)),
      "cudaMallocHost(depth sources)");
  K3_RETURN_IF_ERROR(sources_.Reserve(sources));
  for (int32_t s = capacity.sequences - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int32_t p = capacity.cache_pages - 1; p >= 0; --p) free_pages_.push_back(p);
  return absl::OkStatus();
}

absl::Status GpuModelRunner::UploadRouter(const MoeWeights& moe, Layer* layer) {
  K3_RETURN_IF_ERROR(UploadBf16Matrix(moe.router.gate, "router gate", &layer->router_gate));
  if (!moe.router.score_bias.empty()) {
    K3_RETURN_IF_ERROR(layer->score_bias.Upload(moe.router.score_bias));
  }
  if (weights_->config.IsLatentMoe()) {
    K3_RETURN_IF_ERROR(
        UploadBf16Matrix(moe.router.latent_down, "latent_down", &layer->latent_down));
    if (!moe.router.latent_norm.empty()) {
      K3_RETURN_IF_ERROR(layer->latent_norm.Upload(moe.router.latent_norm));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuSequence>> GpuModelRunner::NewSequence() {
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError("GpuModelRunner: every sequence slot is taken");
  }
  auto sequence = std::make_unique<GpuSequence>();
  sequence->slot = free_slots_.back();
  for (Layer& layer : layers_) {
    if (layer.kda != nullptr) K3_RETURN_IF_ERROR(layer.kda->ResetSlot(sequence->slot));
  }
  free_slots_.pop_back();
  return sequence;
}

void GpuModelRunner::Release(GpuSequence* sequence) {
  if (sequence->slot >= 0) free_slots_.push_back(sequence->slot);
  free_pages_.insert(free_pages_.end(), sequence->pages.begin(), sequence->pages.end());
  sequence->slot = -1;
  sequence->pages.clear();
  sequence->length = 0;
}

absl::Status GpuModelRunner::Sync() {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                    "cudaStreamSynchronize");
}

absl::Status GpuModelRunner::Norm(const float* x, const DeviceBuffer<float>& gamma, int64_t rows,
                                  float* out) {
  const int64_t d = weights_->config.hidden_size;
  return CudaStatus(LaunchRmsNorm(x, d, static_cast<int32_t>(rows), static_cast<int32_t>(d),
                                  gamma.get(), weights_->config.rms_norm_eps, out, d, stream_),
                    "LaunchRmsNorm");
}

absl::Status GpuModelRunner::DepthRead(const DeviceBuffer<float>& proj,
                                       const DeviceBuffer<float>& norm, float* out) {
  if (depth_read_ >= source_slices_ || block_count_ + 1 > source_width_) {
    return absl::InternalError("GpuModelRunner: more depth reads than planned");
  }
  // This read's own slice, host and device: earlier reads' copies may still be queued, and a
  // graph's copy node reads the host slice when it is replayed.
  const float** host = pinned_sources_ + depth_read_ * source_width_;
  const float** device = sources_.get() + depth_read_ * source_width_;
  ++depth_read_;
  int32_t count = 0;
  for (int32_t b = 0; b < block_count_; ++b) host[count++] = blocks_[b].get();
  host[count++] = prefix_.get();
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(device, host, count * sizeof(const float*), cudaMemcpyHostToDevice,
                      static_cast<cudaStream_t>(stream_)),
      "cudaMemcpyAsync(depth sources)");
  const ModelConfig& config = weights_->config;
  return CudaStatus(LaunchAttnRes(device, count, static_cast<int32_t>(rows_), config.hidden_size,
                                  proj.get(), norm.get(), config.rms_norm_eps, out, stream_),
                    "LaunchAttnRes");
}

absl::Status GpuModelRunner::Prepare(absl::Span<const GpuBatchEntry> batch, int64_t rows) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  // Pages first: running out leaves every sequence as it was.
  size_t needed = 0;
  for (const GpuBatchEntry& entry : batch) {
    const int64_t length = entry.sequence->length + static_cast<int64_t>(entry.tokens.size());
    const size_t pages = static_cast<size_t>((length + page_size_ - 1) / page_size_);
    needed += pages > entry.sequence->pages.size() ? pages - entry.sequence->pages.size() : 0;
  }
  if (needed > free_pages_.size()) {
    return absl::ResourceExhaustedError(absl::StrCat("GpuModelRunner: the step needs ", needed,
                                                     " more cache pages, ", free_pages_.size(),
                                                     " are free"));
  }
  max_pages_ = 1;
  for (const GpuBatchEntry& entry : batch) {
    const int64_t length = entry.sequence->length + static_cast<int64_t>(entry.tokens.size());
    while (static_cast<int64_t>(entry.sequence->pages.size()) * page_size_ < length) {
      entry.sequence->pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    max_pages_ = std::max(max_pages_, static_cast<int32_t>(entry.sequence->pages.size()));
  }
  std::vector<int32_t> positions, lengths, tables, slots;
  host_rows_.resize(static_cast<size_t>(rows * d));
  int64_t r = 0;
  for (const GpuBatchEntry& entry : batch) {
    slots.push_back(entry.sequence->slot);
    for (size_t t = 0; t < entry.tokens.size(); ++t, ++r) {
      const int32_t position = static_cast<int32_t>(entry.sequence->length + t);
      positions.push_back(position);
      lengths.push_back(position + 1);
      std::vector<int32_t> table = entry.sequence->pages;
      table.resize(max_pages_, table.back());  // never read past the sequence's own pages
      tables.insert(tables.end(), table.begin(), table.end());
      for (int64_t i = 0; i < d; ++i) {
        host_rows_[r * d + i] = weights_->embed_tokens.At(entry.tokens[t], i);
      }
    }
  }
  K3_RETURN_IF_ERROR(positions_.Upload(positions));
  K3_RETURN_IF_ERROR(lengths_.Upload(lengths));
  K3_RETURN_IF_ERROR(row_tables_.Upload(tables));
  K3_RETURN_IF_ERROR(slots_.Upload(slots));
  for (DeviceBuffer<float>* buffer : {&prefix_, &hidden_, &normed_, &mixed_, &ffn_}) {
    K3_RETURN_IF_ERROR(buffer->Reserve(rows * d));
  }
  K3_RETURN_IF_ERROR(routed_.Reserve(rows * config.ExpertWidth()));
  K3_RETURN_IF_ERROR(routed16_.Reserve(rows * config.ExpertWidth()));
  K3_RETURN_IF_ERROR(prefix_.Upload(host_rows_));
  rows_ = rows;
  block_count_ = 0;
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Mix(absl::Span<const GpuBatchEntry> batch, const Layer& layer) {
  const int64_t d = weights_->config.hidden_size;
  if (layer.mla != nullptr) {
    GpuMlaRows rows;
    rows.rows = static_cast<int32_t>(rows_);
    rows.max_pages = max_pages_;
    int32_t max_length = 0;
    for (const GpuBatchEntry& entry : batch) {
      max_length =
          std::max(max_length, static_cast<int32_t>(entry.sequence->length + entry.tokens.size()));
    }
    // With graphs, a bound that holds for the key's whole page count (see the header).
    rows.max_length = graph_lengths_ ? max_pages_ * page_size_ : max_length;
    rows.position = positions_.get();
    rows.lengths = lengths_.get();
    rows.row_tables = row_tables_.get();
    return layer.mla->Forward(normed_.get(), rows, mixed_.get());
  }
  const bool decode = std::all_of(batch.begin(), batch.end(),
                                  [](const GpuBatchEntry& e) { return e.tokens.size() == 1; });
  if (decode) {
    return layer.kda->Decode(normed_.get(), static_cast<int32_t>(batch.size()), slots_.get(),
                             mixed_.get());
  }
  int64_t r = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto tokens = static_cast<int32_t>(batch[e].tokens.size());
    K3_RETURN_IF_ERROR(
        layer.kda->Prefill(normed_.get() + r * d, tokens, slots_.get() + e, mixed_.get() + r * d));
    r += tokens;
  }
  return absl::OkStatus();
}

absl::Status GpuModelRunner::RoutedOnHost(const Layer& layer, int index) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  // The normed rows go to the routed experts; the shared experts run here meanwhile.
  host_rows_.resize(static_cast<size_t>(rows_ * d));
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host_rows_.data(), normed_.get(), rows_ * d * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)),
      "cudaMemcpyAsync(normed rows)");
  K3_RETURN_IF_ERROR(Sync());
  K3_RETURN_IF_ERROR(routed_moe_->Begin(index, host_rows_.data(), rows_));
  K3_RETURN_IF_ERROR(layer.mlp->Run(normed_.get(), rows_, ffn_.get(), /*accumulate=*/false));
  host_routed_.resize(static_cast<size_t>(rows_ * config.ExpertWidth()));
  K3_RETURN_IF_ERROR(routed_moe_->Wait(host_routed_.data()));
  return routed_.Upload(host_routed_);
}

absl::Status GpuModelRunner::RoutedOnDevice(const Layer& layer, int index) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size, width = config.ExpertWidth();
  const int32_t experts = config.num_experts, top_k = config.num_experts_per_token;
  const auto rows = static_cast<int32_t>(rows_);
  K3_RETURN_IF_ERROR(layer.mlp->Run(normed_.get(), rows_, ffn_.get(), /*accumulate=*/false));
  K3_RETURN_IF_ERROR(normed16_.Reserve(rows_ * d));
  K3_RETURN_IF_ERROR(gate_logits_.Reserve(rows_ * experts));
  K3_RETURN_IF_ERROR(gate_scores_.Reserve(rows_ * experts));
  K3_RETURN_IF_ERROR(gate_ids_.Reserve(rows_ * top_k));
  K3_RETURN_IF_ERROR(gate_weights_.Reserve(rows_ * top_k));
  // The router's products, as every product here, on rows rounded to bf16.
  K3_RETURN_IF_CUDA_ERROR(LaunchRoundToBf16(normed_.get(), d, rows, static_cast<int32_t>(d),
                                            normed16_.get(), d, stream_),
                          "LaunchRoundToBf16(router rows)");
  K3_RETURN_IF_ERROR(products_->Linear(layer.router_gate.get(), experts, d, normed16_.get(), rows_,
                                       gate_logits_.get(), /*accumulate=*/false));
  MoeGateArgs gate;
  gate.logits = gate_logits_.get();
  gate.logits_stride = experts;
  gate.bias = layer.score_bias.size() > 0 ? layer.score_bias.get() : nullptr;
  gate.tokens = rows;
  gate.num_experts = experts;
  gate.top_k = top_k;
  gate.renormalize = config.moe_renormalize;
  gate.scaling = config.routed_scaling_factor;
  gate.scores = gate_scores_.get();
  gate.ids = gate_ids_.get();
  gate.weights = gate_weights_.get();
  K3_RETURN_IF_CUDA_ERROR(static_cast<cudaError_t>(LaunchMoeGate(gate, stream_)), "LaunchMoeGate");
  const float* z = normed_.get();
  if (config.IsLatentMoe()) {
    K3_RETURN_IF_ERROR(latent_.Reserve(rows_ * width));
    K3_RETURN_IF_ERROR(products_->Linear(layer.latent_down.get(), width, d, normed16_.get(), rows_,
                                         latent_.get(), /*accumulate=*/false));
    z = latent_.get();
  }
  K3_RETURN_IF_ERROR(device_experts_(index, z, rows_, width, gate_ids_.get(), gate_weights_.get(),
                                     top_k, routed_.get(), stream_));
  if (!config.IsLatentMoe() || layer.latent_norm.size() == 0) return absl::OkStatus();
  return CudaStatus(
      LaunchRmsNorm(routed_.get(), width, rows, static_cast<int32_t>(width),
                    layer.latent_norm.get(), config.rms_norm_eps, routed_.get(), width, stream_),
      "LaunchRmsNorm(latent)");
}

absl::Status GpuModelRunner::Ffn(const Layer& layer, int index) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  if (!weights_->layers[index].is_moe) {
    return layer.mlp->Run(normed_.get(), rows_, ffn_.get(), /*accumulate=*/false);
  }
  absl::Status routed =
      device_experts_ != nullptr ? RoutedOnDevice(layer, index) : RoutedOnHost(layer, index);
  if (!routed.ok() && device_experts_ != nullptr && routed_moe_ != nullptr) {
    // Usually the device path is just not open (yet); its own failures it logs itself.
    VLOG(1) << "MoE layer " << index << " through the router tier: " << routed;
    routed = RoutedOnHost(layer, index);
  }
  K3_RETURN_IF_ERROR(routed);
  const int64_t width = config.ExpertWidth();
  if (!config.IsLatentMoe()) return products_->Add(routed_.get(), ffn_.get(), rows_ * d);
  K3_RETURN_IF_CUDA_ERROR(
      LaunchRoundToBf16(routed_.get(), width, static_cast<int32_t>(rows_),
                        static_cast<int32_t>(width), routed16_.get(), width, stream_),
      "LaunchRoundToBf16(routed)");
  return products_->Linear(layer.latent_up.get(), d, width, routed16_.get(), rows_, ffn_.get(),
                           /*accumulate=*/true);
}

absl::Status GpuModelRunner::RunLayer(absl::Span<const GpuBatchEntry> batch, int index) {
  const ModelConfig& config = weights_->config;
  const Layer& layer = layers_[index];
  const int64_t values = rows_ * config.hidden_size;
  auto stream = static_cast<cudaStream_t>(stream_);
  const bool attn_res = config.HasAttnRes();
  // --- sequence-mixing sublayer (ModelRunner::StartLayer)
  bool prefix_empty = false;
  if (attn_res) {
    if (block_count_ == 0) {
      K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(hidden_.get(), prefix_.get(), values * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream),
                              "cudaMemcpyAsync(hidden)");
    } else {
      K3_RETURN_IF_ERROR(DepthRead(layer.attn_res_proj, layer.attn_res_norm, hidden_.get()));
    }
    if (index % *config.attn_res_block_size == 0) {
      if (block_count_ == static_cast<int32_t>(blocks_.size())) blocks_.emplace_back();
      DeviceBuffer<float>& block = blocks_[block_count_++];
      K3_RETURN_IF_ERROR(block.Reserve(values));
      K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(block.get(), prefix_.get(), values * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream),
                              "cudaMemcpyAsync(block)");
      prefix_empty = true;
    }
  }
  K3_RETURN_IF_ERROR(
      Norm(attn_res ? hidden_.get() : prefix_.get(), layer.input_norm, rows_, normed_.get()));
  K3_RETURN_IF_ERROR(Mix(batch, layer));
  if (prefix_empty) {
    std::swap(prefix_, mixed_);
  } else {
    K3_RETURN_IF_ERROR(products_->Add(mixed_.get(), prefix_.get(), values));
  }
  // --- FFN sublayer
  if (attn_res)
    K3_RETURN_IF_ERROR(DepthRead(layer.mlp_res_proj, layer.mlp_res_norm, hidden_.get()));
  K3_RETURN_IF_ERROR(
      Norm(attn_res ? hidden_.get() : prefix_.get(), layer.post_norm, rows_, normed_.get()));
  K3_RETURN_IF_ERROR(Ffn(layer, index));
  return products_->Add(ffn_.get(), prefix_.get(), values);
}

absl::Status GpuModelRunner::OutputRows(absl::Span<const GpuBatchEntry> batch) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  auto stream = static_cast<cudaStream_t>(stream_);
  if (config.HasAttnRes()) {
    K3_RETURN_IF_ERROR(DepthRead(output_res_proj_, output_res_norm_, hidden_.get()));
  } else {
    K3_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(hidden_.get(), prefix_.get(), rows_ * d * sizeof(float),
                                            cudaMemcpyDeviceToDevice, stream),
                            "cudaMemcpyAsync(hidden)");
  }
  const int64_t logit_rows = logit_rows_;
  K3_RETURN_IF_ERROR(selected_.Reserve(logit_rows * d));
  K3_RETURN_IF_ERROR(selected16_.Reserve(logit_rows * d));
  K3_RETURN_IF_ERROR(logits_.Reserve(logit_rows * config.vocab_size));
  int64_t r = 0, out_row = 0;
  for (const GpuBatchEntry& entry : batch) {
    const auto count = static_cast<int64_t>(entry.tokens.size());
    const int64_t first = entry.all_logits ? 0 : count - 1;
    K3_RETURN_IF_ERROR(Norm(hidden_.get() + (r + first) * d, final_norm_, count - first,
                            selected_.get() + out_row * d));
    out_row += count - first;
    r += count;
  }
  K3_RETURN_IF_CUDA_ERROR(LaunchRoundToBf16(selected_.get(), d, static_cast<int32_t>(logit_rows),
                                            static_cast<int32_t>(d), selected16_.get(), d, stream_),
                          "LaunchRoundToBf16(selected)");
  return products_->Linear(lm_head_.get(), config.vocab_size, d, selected16_.get(), logit_rows,
                           logits_.get(), /*accumulate=*/false);
}

absl::Status GpuModelRunner::Forward(absl::Span<const GpuBatchEntry> batch) {
  block_count_ = 0;
  depth_read_ = 0;
  float* const prefix = prefix_.get();
  absl::Status status;
  for (int l = 0; l < weights_->config.num_hidden_layers && status.ok(); ++l) {
    status = RunLayer(batch, l);
  }
  if (status.ok()) status = OutputRows(batch);
  // Every step starts with the same buffer as prefix_, so that a graph's addresses hold.
  if (prefix_.get() != prefix) std::swap(prefix_, mixed_);
  return status;
}

absl::Status GpuModelRunner::SetCudaGraphs(bool on) {
  if (on && (device_experts_ == nullptr || routed_moe_ != nullptr)) {
    // A layer may leave the device (the router tier's path, or its fallback): no capture.
    return absl::InvalidArgumentError(
        "GpuModelRunner: CUDA graphs need device routing with no RoutedMoe");
  }
  cuda_graphs_ = on;
  return absl::OkStatus();
}

absl::Status GpuModelRunner::GraphedForward(absl::Span<const GpuBatchEntry> batch) {
  auto stream = static_cast<cudaStream_t>(stream_);
  const uint64_t epoch = DeviceAllocationEpoch().load();
  StepGraph& graph = graphs_[{static_cast<int32_t>(batch.size()), max_pages_}];
  if (graph.exec != nullptr && graph.captured_epoch != epoch) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph.exec));
    graph.exec = nullptr;
  }
  if (graph.exec == nullptr && graph.warmed_epoch != epoch) {
    // First of its key since buffers last changed: grow them in an ordinary run.
    K3_RETURN_IF_ERROR(Forward(batch));
    graph.warmed_epoch = DeviceAllocationEpoch().load();
    return absl::OkStatus();
  }
  if (graph.exec == nullptr) {
    K3_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed),
                            "cudaStreamBeginCapture");
    const absl::Status status = Forward(batch);
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &captured);
    cudaGraphExec_t exec = nullptr;
    const bool usable = status.ok() && ended == cudaSuccess &&
                        DeviceAllocationEpoch().load() == epoch &&
                        cudaGraphInstantiate(&exec, captured, 0) == cudaSuccess;
    if (captured != nullptr) cudaGraphDestroy(captured);
    if (!usable) {
      // Nothing of the step ran: run it without a graph and try again at the next step.
      cudaGetLastError();
      graph.warmed_epoch = ~uint64_t{0};
      K3_RETURN_IF_ERROR(Forward(batch));
      graph.warmed_epoch = DeviceAllocationEpoch().load();
      return absl::OkStatus();
    }
    graph.exec = exec;
    graph.captured_epoch = epoch;
  }
  ++graph_launches_;
  return CudaStatus(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.exec), stream),
                    "cudaGraphLaunch");
}

absl::Status GpuModelRunner::Step(absl::Span<const GpuBatchEntry> batch,
                                  std::vector<float>* logits) {
  const ModelConfig& config = weights_->config;
  int64_t rows = 0;
  for (const GpuBatchEntry& entry : batch) {
    if (entry.sequence == nullptr || entry.sequence->slot < 0 || entry.tokens.empty()) {
      return absl::InvalidArgumentError(
          "every batch entry needs a live sequence and at least one token");
    }
    for (int32_t token : entry.tokens) {
      if (token < 0 || token >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", token, " outside the vocabulary [0, ", config.vocab_size, ")"));
      }
    }
    rows += static_cast<int64_t>(entry.tokens.size());
  }
  if (batch.empty()) return absl::InvalidArgumentError("an empty batch");
  logit_rows_ = 0;
  for (const GpuBatchEntry& entry : batch) {
    logit_rows_ += entry.all_logits ? static_cast<int64_t>(entry.tokens.size()) : 1;
  }
  K3_RETURN_IF_ERROR(Prepare(batch, rows));
  const bool graphed = cuda_graphs_ && rows == static_cast<int64_t>(batch.size());
  graph_lengths_ = graphed;
  if (absl::Status s = graphed ? GraphedForward(batch) : Forward(batch); !s.ok()) {
    if (routed_moe_ != nullptr) routed_moe_->Abandon();
    return s;
  }
  logits->resize(static_cast<size_t>(logit_rows_ * config.vocab_size));
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(logits->data(), logits_.get(), logits->size() * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)),
      "cudaMemcpyAsync(logits)");
  K3_RETURN_IF_ERROR(Sync());
  for (const GpuBatchEntry& entry : batch) entry.sequence->length += entry.tokens.size();
  return absl::OkStatus();
}

}  // namespace k3
