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

namespace k3 {
namespace {

absl::StatusOr<std::unique_ptr<GpuGatedMlp>> UploadMlp(const GatedMlpWeights& w,
                                                       const GluParams& glu, void* stream) {
  return GpuGatedMlp::Create(GatedMlpMatrices{w.gate, w.up, w.down}, glu, stream);
}

}  // namespace

GpuModelRunner::GpuModelRunner(const ModelWeights* weights, RoutedMoe* routed_moe)
    : weights_(weights), routed_moe_(routed_moe) {}

GpuModelRunner::~GpuModelRunner() {
  // Everything that enqueues on the stream or holds its cuBLAS handle goes before the stream.
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  layers_.clear();
  products_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::StatusOr<std::unique_ptr<GpuModelRunner>> GpuModelRunner::Create(
    const ModelWeights* weights, RoutedMoe* routed_moe, const GpuRunnerCapacity& capacity) {
  if (capacity.sequences < 1 || capacity.cache_pages < 1 || capacity.page_size < 1) {
    return absl::InvalidArgumentError("GpuModelRunner: capacity needs sequences and pages");
  }
  std::unique_ptr<GpuModelRunner> runner(new GpuModelRunner(weights, routed_moe));
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
      K3_ASSIGN_OR_RETURN(layer.mlp, UploadMlp(lw.dense_mlp, glu, stream_));
    } else {
      K3_ASSIGN_OR_RETURN(layer.mlp, UploadMlp(lw.moe.shared, glu, stream_));
      if (config.IsLatentMoe()) {
        K3_RETURN_IF_ERROR(UploadBf16Matrix(lw.moe.latent_up, "latent_up", &layer.latent_up));
      }
    }
  }
  K3_RETURN_IF_ERROR(UploadBf16Matrix(weights_->lm_head, "lm_head", &lm_head_));
  K3_RETURN_IF_ERROR(final_norm_.Upload(weights_->final_norm));
  if (config.HasAttnRes()) {
    K3_RETURN_IF_ERROR(output_res_proj_.Upload(weights_->output_attn_res_proj));
    K3_RETURN_IF_ERROR(output_res_norm_.Upload(weights_->output_attn_res_norm));
  }
  for (int32_t s = capacity.sequences - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int32_t p = capacity.cache_pages - 1; p >= 0; --p) free_pages_.push_back(p);
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
  std::vector<const float*> sources;
  for (int32_t b = 0; b < block_count_; ++b) sources.push_back(blocks_[b].get());
  sources.push_back(prefix_.get());
  K3_RETURN_IF_ERROR(sources_.Reserve(sources.size()));
  // From pageable memory: the call returns once the pointers are staged.
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(sources_.get(), sources.data(), sources.size() * sizeof(const float*),
                      cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)),
      "cudaMemcpyAsync(depth sources)");
  const ModelConfig& config = weights_->config;
  return CudaStatus(LaunchAttnRes(sources_.get(), static_cast<int32_t>(sources.size()),
                                  static_cast<int32_t>(rows_), config.hidden_size, proj.get(),
                                  norm.get(), config.rms_norm_eps, out, stream_),
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
    rows.max_length = max_length;
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

absl::Status GpuModelRunner::Ffn(const Layer& layer, int index) {
  const ModelConfig& config = weights_->config;
  const int64_t d = config.hidden_size;
  if (!weights_->layers[index].is_moe) {
    return layer.mlp->Run(normed_.get(), rows_, ffn_.get(), /*accumulate=*/false);
  }
  // The normed rows go to the routed experts; the shared experts run here meanwhile.
  host_rows_.resize(static_cast<size_t>(rows_ * d));
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host_rows_.data(), normed_.get(), rows_ * d * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)),
      "cudaMemcpyAsync(normed rows)");
  K3_RETURN_IF_ERROR(Sync());
  K3_RETURN_IF_ERROR(routed_moe_->Begin(index, host_rows_.data(), rows_));
  K3_RETURN_IF_ERROR(layer.mlp->Run(normed_.get(), rows_, ffn_.get(), /*accumulate=*/false));
  const int64_t width = config.ExpertWidth();
  host_routed_.resize(static_cast<size_t>(rows_ * width));
  K3_RETURN_IF_ERROR(routed_moe_->Wait(host_routed_.data()));
  K3_RETURN_IF_ERROR(routed_.Upload(host_routed_));
  if (!config.IsLatentMoe()) return products_->Add(routed_.get(), ffn_.get(), rows_ * d);
  if (rows_ > 65535) return absl::InvalidArgumentError("GpuModelRunner: over 65,535 rows");
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

absl::Status GpuModelRunner::Output(absl::Span<const GpuBatchEntry> batch,
                                    std::vector<float>* logits) {
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
  int64_t logit_rows = 0;
  for (const GpuBatchEntry& entry : batch) {
    logit_rows += entry.all_logits ? static_cast<int64_t>(entry.tokens.size()) : 1;
  }
  if (logit_rows > 65535) return absl::InvalidArgumentError("GpuModelRunner: over 65,535 logits");
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
  K3_RETURN_IF_ERROR(products_->Linear(lm_head_.get(), config.vocab_size, d, selected16_.get(),
                                       logit_rows, logits_.get(), /*accumulate=*/false));
  logits->resize(static_cast<size_t>(logit_rows * config.vocab_size));
  K3_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(logits->data(), logits_.get(), logits->size() * sizeof(float),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(logits)");
  return Sync();
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
  K3_RETURN_IF_ERROR(Prepare(batch, rows));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    if (absl::Status s = RunLayer(batch, l); !s.ok()) {
      routed_moe_->Abandon();
      return s;
    }
  }
  K3_RETURN_IF_ERROR(Output(batch, logits));
  for (const GpuBatchEntry& entry : batch) entry.sequence->length += entry.tokens.size();
  return absl::OkStatus();
}

}  // namespace k3
