#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/mxfp4.h"

namespace k3 {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool IsFloat(DType dtype) {
  return dtype == DType::kBf16 || dtype == DType::kF16 || dtype == DType::kF32;
}

// Element i of a BF16/F16/F32 tensor; the mapping may be unaligned, so read bytes.
float FloatAt(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kBf16: {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      return Bf16ToFloat(bits);
    }
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      return HalfToFloat(bits);
    }
    default: {
      float value;
      std::memcpy(&value, t.data + 4 * i, 4);
      return value;
    }
  }
}

void ToFloats(const TensorView& t, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = FloatAt(t, i);
}

// Whether any of the `count` values of `Bits` at `data` has all of `exponent` set (a NaN or an
// infinity). Every weight is scanned at load, so this is the hot loop: adding the exponent's lowest
// bit to the exponent bits carries into the sign bit only when they are all set, so an OR of
// those sums over fixed-size blocks (which compilers vectorize) tells whether a block has one
// (about 10 GB/s on one core; 3 GB/s as a per-value comparison).
template <typename Bits, Bits kExponent>
bool AnyNonFinite(const uint8_t* data, int64_t count) {
  constexpr Bits kLowest = kExponent & (~kExponent + 1);
  constexpr Bits kCarry = static_cast<Bits>(kExponent + kLowest);
  constexpr int64_t kBlock = 1024;
  auto carry = [data](int64_t i) -> Bits {
    Bits bits;
    std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
    return static_cast<Bits>((bits & kExponent) + kLowest);
  };
  int64_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    Bits any = 0;
    for (int64_t j = 0; j < kBlock; ++j) any |= carry(i + j);
    if (any & kCarry) return true;
  }
  Bits any = 0;
  for (; i < count; ++i) any |= carry(i);
  return (any & kCarry) != 0;
}

// DATA_LOSS naming the tensor and its first NaN or infinity among its first `count` values.
absl::Status CheckFinite(const TensorView& t, int64_t count) {
  bool any;
  switch (t.dtype) {
    case DType::kBf16:
      any = AnyNonFinite<uint16_t, 0x7f80>(t.data, count);
      break;
    case DType::kF16:
      any = AnyNonFinite<uint16_t, 0x7c00>(t.data, count);
      break;
    default:
      any = AnyNonFinite<uint32_t, 0x7f800000u>(t.data, count);
      break;
  }
  if (!any) return absl::OkStatus();
  int64_t i = 0;
  while (std::isfinite(FloatAt(t, i))) ++i;
  return absl::DataLossError(absl::StrCat("tensor '", t.name, "' in ", t.file, ": value ", i,
                                          " is ", FloatAt(t, i),
                                          "; weights must be finite (a corrupt checkpoint?)"));
}

// Walks the tensors a selection needs. Run once with `counting` to learn the total for progress
// reports, then for real; both runs make the same calls.
class Loader {
 public:
  Loader(const Checkpoint& checkpoint, ModelWeights* weights, bool counting, size_t total,
         const std::function<void(size_t, size_t)>& progress,
         std::optional<QuantizationIgnoreList> ignore)
      : checkpoint_(checkpoint),
        weights_(weights),
        counting_(counting),
        total_(total),
        progress_(progress),
        ignore_(std::move(ignore)) {}

  size_t done() const { return done_; }

  // `name` ends in ".weight". With `may_be_mxfp4` the checkpoint may store it as an MXFP4 pair
  // instead (name + "_packed", name + "_scale"; spec §10).
  absl::Status Matrix(const std::string& name, int64_t rows, int64_t cols, WeightMatrix* out,
                      bool may_be_mxfp4 = false) {
    if (counting_) return Count();
    if (!checkpoint_.Has(name) && checkpoint_.Has(name + "_packed")) {
      if (!may_be_mxfp4) {
        K3_ASSIGN_OR_RETURN(TensorView packed, checkpoint_.Find(name + "_packed"));
        return absl::UnimplementedError(absl::StrCat("tensor '", packed.name, "' in ", packed.file,
                                                     ": MXFP4 is computed for routed experts only "
                                                     "(the release packs only those, spec §10)"));
      }
      K3_RETURN_IF_ERROR(Mxfp4Matrix(name, rows, cols, out));
      return Done();
    }
    K3_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Find(name));
    K3_RETURN_IF_ERROR(Check(t, {rows, cols}, t.shape == std::vector<int64_t>{rows, cols}));
    K3_RETURN_IF_ERROR(CheckFinite(t, rows * cols));
    out->rows = rows;
    out->cols = cols;
    const auto address = reinterpret_cast<uintptr_t>(t.data);
    if (t.dtype == DType::kBf16 && address % alignof(uint16_t) == 0) {
      out->data = t.data;
      out->type = WeightType::kBf16;
      weights_->selected_bytes += t.bytes;
    } else if (t.dtype == DType::kF32 && address % alignof(float) == 0) {
      out->data = t.data;
      out->type = WeightType::kF32;
      weights_->selected_bytes += t.bytes;
    } else {
      // F16, or a tensor the file placed at an odd offset: widen once into owned fp32.
      std::vector<float>& owned = weights_->owned.emplace_back(rows * cols);
      ToFloats(t, rows * cols, owned.data());
      out->data = owned.data();
      out->type = WeightType::kF32;
      weights_->selected_bytes += owned.size() * sizeof(float);
    }
    return Done();
  }

  absl::Status Vector(const std::string& name, int64_t n, std::vector<float>* out) {
    if (counting_) return Count();
    K3_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Find(name));
    K3_RETURN_IF_ERROR(Check(t, {n}, t.shape == std::vector<int64_t>{n}));
    return Copy(t, n, out);
  }

  // AttnRes queries are stored as Linear(d -> 1) weights [1, d]; a bare [d] is accepted too.
  absl::Status RowVector(const std::string& name, int64_t n, std::vector<float>* out) {
    if (counting_) return Count();
    K3_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Find(name));
    K3_RETURN_IF_ERROR(Check(t, {1, n},
                             t.shape == std::vector<int64_t>{1, n} ||
                                 t.shape == std::vector<int64_t>{n}));
    return Copy(t, n, out);
  }

  // Depthwise conv weights: [C, 1, K] as PyTorch stores them, or squeezed to [C, K] (spec §11.2).
  absl::Status Conv(const std::string& name, int64_t channels, int64_t kernel,
                    std::vector<float>* out) {
    if (counting_) return Count();
    K3_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Find(name));
    K3_RETURN_IF_ERROR(Check(t, {channels, 1, kernel},
                             t.shape == std::vector<int64_t>{channels, 1, kernel} ||
                                 t.shape == std::vector<int64_t>{channels, kernel}));
    return Copy(t, channels * kernel, out);
  }

  // Spec §11.1: flatten; exactly H values are used as is; more are accepted when the tail past H
  // is all zeros (the K3 release pads 96 heads to 128).
  absl::Status ALog(const std::string& name, int64_t heads, std::vector<float>* out) {
    if (counting_) return Count();
    K3_ASSIGN_OR_RETURN(TensorView t, checkpoint_.Find(name));
    const int64_t numel = t.numel();
    K3_RETURN_IF_ERROR(Check(t, {heads}, numel >= heads));
    for (int64_t i = heads; i < numel; ++i) {
      float value = FloatAt(t, i);
      if (value != 0.0f) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "' in ", t.file, ": holds ", numel, " values for ", heads,
            " heads and value ", i, " past the heads is ", value,
            ", not zero padding (spec §11.1)"));
      }
    }
    return Copy(t, heads, out);
  }

 private:
  absl::Status Count() {
    ++done_;
    return absl::OkStatus();
  }

  absl::Status Done() {
    ++done_;
    if (progress_) progress_(done_, total_);
    return absl::OkStatus();
  }

  // The packed codes and scales of `name` (".weight" replaced), checked against the config's
  // quantization_config and the shapes [rows, cols / 2] and [rows, cols / 32], and every scale
  // byte checked (255 is NaN; 253 and 254 overflow fp32, kernels/mxfp4.h). Maps; copies nothing.
  absl::Status Mxfp4Matrix(const std::string& name, int64_t rows, int64_t cols, WeightMatrix* out) {
    K3_ASSIGN_OR_RETURN(TensorView packed, checkpoint_.Find(name + "_packed"));
    K3_ASSIGN_OR_RETURN(TensorView scale, checkpoint_.Find(name + "_scale"));
    const std::string where = absl::StrCat("tensor '", packed.name, "' in ", packed.file, ": ");
    if (!ignore_.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "MXFP4-packed, but config.json has no quantization_config (spec §10)"));
    }
    const std::string module = packed.name.substr(0, packed.name.size() - strlen(".weight_packed"));
    if (ignore_->Ignores(module)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "MXFP4-packed, but quantization_config's ignore list leaves module '",
                       module, "' unquantized"));
    }
    if (cols % kMxfp4Group != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, cols, " inputs are not whole MXFP4 groups of ", kMxfp4Group));
    }
    const std::vector<int64_t> packed_shape = {rows, cols / 2};
    const std::vector<int64_t> scale_shape = {rows, cols / kMxfp4Group};
    if (packed.dtype != DType::kU8 || packed.shape != packed_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected MXFP4 codes of shape ", ShapeString(packed_shape), " of U8, found ",
          ShapeString(packed.shape), " of ", DTypeName(packed.dtype).data()));
    }
    if ((scale.dtype != DType::kU8 && scale.dtype != DType::kF8E8M0) ||
        scale.shape != scale_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", scale.name, "' in ", scale.file, ": expected E8M0 scales of shape ",
          ShapeString(scale_shape), " of U8 or F8_E8M0, found ", ShapeString(scale.shape), " of ",
          DTypeName(scale.dtype).data()));
    }
    for (int64_t i = 0; i < rows * (cols / kMxfp4Group); ++i) {
      const uint8_t s = scale.data[i];
      if (s <= kMxfp4MaxScale) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", scale.name, "' in ", scale.file, ": row ", i / (cols / kMxfp4Group),
          ", group ", i % (cols / kMxfp4Group), " has scale byte ", s,
          s == kMxfp4NanScale ? " (NaN in the MX standard)"
                              : " (2^126 or more: the larger E2M1 values overflow fp32)"));
    }
    out->rows = rows;
    out->cols = cols;
    out->data = packed.data;
    out->scales = scale.data;
    out->type = WeightType::kMxfp4;
    weights_->selected_bytes += packed.bytes + scale.bytes;
    return absl::OkStatus();
  }

  absl::Status Check(const TensorView& t, const std::vector<int64_t>& expected, bool shape_ok) {
    if (shape_ok && IsFloat(t.dtype)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", t.name, "' in ", t.file, ": expected shape ", ShapeString(expected),
        " of BF16/F16/F32, found ", ShapeString(t.shape), " of ", DTypeName(t.dtype).data()));
  }

  absl::Status Copy(const TensorView& t, int64_t n, std::vector<float>* out) {
    K3_RETURN_IF_ERROR(CheckFinite(t, n));
    out->resize(n);
    ToFloats(t, n, out->data());
    weights_->selected_bytes += n * sizeof(float);
    return Done();
  }

  const Checkpoint& checkpoint_;
  ModelWeights* weights_;
  const bool counting_;
  const size_t total_;
  const std::function<void(size_t, size_t)>& progress_;
  // Set when the config has a quantization_config.
  const std::optional<QuantizationIgnoreList> ignore_;
  size_t done_ = 0;
};

absl::Status LoadKda(Loader& ld, const ModelConfig& c, const std::string& p, KdaWeights* kda) {
  const int64_t d = c.hidden_size;
  const int64_t heads = c.linear_attn.num_heads;
  const int64_t head_dim = c.linear_attn.head_dim;
  const int64_t width = c.KdaWidth();
  const int64_t kernel = c.linear_attn.short_conv_kernel_size;
  K3_RETURN_IF_ERROR(ld.Matrix(p + "q_proj.weight", width, d, &kda->q_proj));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "k_proj.weight", width, d, &kda->k_proj));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "v_proj.weight", width, d, &kda->v_proj));
  K3_RETURN_IF_ERROR(ld.Conv(p + "q_conv1d.weight", width, kernel, &kda->q_conv));
  K3_RETURN_IF_ERROR(ld.Conv(p + "k_conv1d.weight", width, kernel, &kda->k_conv));
  K3_RETURN_IF_ERROR(ld.Conv(p + "v_conv1d.weight", width, kernel, &kda->v_conv));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "f_a_proj.weight", head_dim, d, &kda->f_a_proj));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "f_b_proj.weight", width, head_dim, &kda->f_b_proj));
  K3_RETURN_IF_ERROR(ld.Vector(p + "dt_bias", width, &kda->dt_bias));
  K3_RETURN_IF_ERROR(ld.ALog(p + "A_log", heads, &kda->a_log));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "b_proj.weight", heads, d, &kda->b_proj));
  if (c.linear_attn.use_full_rank_gate) {
    K3_RETURN_IF_ERROR(ld.Matrix(p + "g_proj.weight", width, d, &kda->g_proj));
  } else {
    K3_RETURN_IF_ERROR(ld.Matrix(p + "g_a_proj.weight", head_dim, d, &kda->g_a_proj));
    K3_RETURN_IF_ERROR(ld.Matrix(p + "g_b_proj.weight", width, head_dim, &kda->g_b_proj));
  }
  K3_RETURN_IF_ERROR(ld.Vector(p + "o_norm.weight", head_dim, &kda->o_norm));
  return ld.Matrix(p + "o_proj.weight", d, width, &kda->o_proj);
}

absl::Status LoadMla(Loader& ld, const ModelConfig& c, const std::string& p, MlaWeights* mla) {
  const int64_t d = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t q_width = heads * c.MlaQHeadDim();
  if (c.q_lora_rank) {
    const int64_t rank = *c.q_lora_rank;
    K3_RETURN_IF_ERROR(ld.Matrix(p + "q_a_proj.weight", rank, d, &mla->q_a_proj));
    K3_RETURN_IF_ERROR(ld.Vector(p + "q_a_layernorm.weight", rank, &mla->q_a_layernorm));
    K3_RETURN_IF_ERROR(ld.Matrix(p + "q_b_proj.weight", q_width, rank, &mla->q_b_proj));
  } else {
    K3_RETURN_IF_ERROR(ld.Matrix(p + "q_proj.weight", q_width, d, &mla->q_proj));
  }
  K3_RETURN_IF_ERROR(
      ld.Matrix(p + "kv_a_proj_with_mqa.weight", c.MlaCacheWidth(), d, &mla->kv_a_proj_with_mqa));
  K3_RETURN_IF_ERROR(ld.Vector(p + "kv_a_layernorm.weight", c.kv_lora_rank, &mla->kv_a_layernorm));
  K3_RETURN_IF_ERROR(ld.Matrix(p + "kv_b_proj.weight",
                               heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
                               &mla->kv_b_proj));
  if (c.mla_use_output_gate) {
    K3_RETURN_IF_ERROR(ld.Matrix(p + "g_proj.weight", heads * c.v_head_dim, d, &mla->g_proj));
  }
  return ld.Matrix(p + "o_proj.weight", d, heads * c.v_head_dim, &mla->o_proj);
}

absl::Status LoadGatedMlp(Loader& ld, const std::string& gate, const std::string& up,
                          const std::string& down, int64_t width, int64_t inner,
                          GatedMlpWeights* mlp, bool may_be_mxfp4 = false) {
  K3_RETURN_IF_ERROR(ld.Matrix(gate, inner, width, &mlp->gate, may_be_mxfp4));
  K3_RETURN_IF_ERROR(ld.Matrix(up, inner, width, &mlp->up, may_be_mxfp4));
  return ld.Matrix(down, width, inner, &mlp->down, may_be_mxfp4);
}

// The weights outside the layers: the embedding, the final norm, the attention residuals' output
// norm and projection, and lm_head (the embedding again when tied and the checkpoint has none).
absl::Status LoadOuterWeights(Loader& ld, const Checkpoint& ckpt, ModelWeights* w) {
  const ModelConfig& c = w->config;
  const int64_t d = c.hidden_size;
  K3_RETURN_IF_ERROR(ld.Matrix("model.embed_tokens.weight", c.vocab_size, d, &w->embed_tokens));
  K3_RETURN_IF_ERROR(ld.Vector("model.norm.weight", d, &w->final_norm));
  if (c.HasAttnRes()) {
    K3_RETURN_IF_ERROR(
        ld.Vector("model.output_attn_res_norm.weight", d, &w->output_attn_res_norm));
    K3_RETURN_IF_ERROR(
        ld.RowVector("model.output_attn_res_proj.weight", d, &w->output_attn_res_proj));
  }
  if (c.tie_word_embeddings && !ckpt.Has("lm_head.weight")) {
    w->lm_head = w->embed_tokens;
    return absl::OkStatus();
  }
  return ld.Matrix("lm_head.weight", c.vocab_size, d, &w->lm_head);
}

// The attention side of layer `p` (its tensor name prefix): norms, residual projections, the
// KDA or MLA block, and a dense layer's MLP.
absl::Status LoadLayerAttention(Loader& ld, const ModelConfig& c, const std::string& p,
                                LayerWeights* layer) {
  const int64_t d = c.hidden_size;
  K3_RETURN_IF_ERROR(ld.Vector(p + "input_layernorm.weight", d, &layer->input_layernorm));
  K3_RETURN_IF_ERROR(
      ld.Vector(p + "post_attention_layernorm.weight", d, &layer->post_attention_layernorm));
  if (c.HasAttnRes()) {
    K3_RETURN_IF_ERROR(ld.Vector(p + "self_attention_res_norm.weight", d, &layer->attn_res_norm));
    K3_RETURN_IF_ERROR(
        ld.RowVector(p + "self_attention_res_proj.weight", d, &layer->attn_res_proj));
    K3_RETURN_IF_ERROR(ld.Vector(p + "mlp_res_norm.weight", d, &layer->mlp_res_norm));
    K3_RETURN_IF_ERROR(ld.RowVector(p + "mlp_res_proj.weight", d, &layer->mlp_res_proj));
  }
  if (layer->is_kda) {
    K3_RETURN_IF_ERROR(LoadKda(ld, c, p + "self_attn.", &layer->kda));
  } else {
    K3_RETURN_IF_ERROR(LoadMla(ld, c, p + "self_attn.", &layer->mla));
  }
  if (layer->is_moe) return absl::OkStatus();
  return LoadGatedMlp(ld, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                      p + "mlp.down_proj.weight", d, c.intermediate_size, &layer->dense_mlp);
}

// The MoE block of layer `p` (its tensor name prefix), as far as `sel` asks: the shared experts
// and the latent up-projection (attention side), the gate (router side), the selected experts.
absl::Status LoadMoeBlock(Loader& ld, const ModelConfig& c, const WeightSelection& sel,
                          const std::string& p, MoeWeights* moe) {
  const int64_t d = c.hidden_size;
  const std::string m = p + "block_sparse_moe.";
  const int64_t latent = c.ExpertWidth();
  if (sel.attention) {
    if (c.num_shared_experts > 0) {
      K3_RETURN_IF_ERROR(LoadGatedMlp(
          ld, m + "shared_experts.gate_proj.weight", m + "shared_experts.up_proj.weight",
          m + "shared_experts.down_proj.weight", d, c.SharedWidth(), &moe->shared));
    }
    if (c.IsLatentMoe()) {
      K3_RETURN_IF_ERROR(ld.Matrix(m + "routed_expert_up_proj.weight", d, latent, &moe->latent_up));
    }
  }
  if (sel.router) {
    K3_RETURN_IF_ERROR(ld.Matrix(m + "gate.weight", c.num_experts, d, &moe->router.gate));
    K3_RETURN_IF_ERROR(
        ld.Vector(m + "gate.e_score_correction_bias", c.num_experts, &moe->router.score_bias));
    if (c.IsLatentMoe()) {
      K3_RETURN_IF_ERROR(ld.Matrix(m + "routed_expert_down_proj.weight", latent, d,
                                   &moe->router.latent_down));
      if (c.latent_moe_use_norm) {
        K3_RETURN_IF_ERROR(
            ld.Vector(m + "routed_expert_norm.weight", latent, &moe->router.latent_norm));
      }
    }
  }
  moe->experts.resize(c.num_experts);
  auto load_expert = [&](int e) {
    const std::string x = absl::StrCat(m, "experts.", e, ".");
    return LoadGatedMlp(ld, x + "w1.weight", x + "w3.weight", x + "w2.weight", latent,
                        c.moe_intermediate_size, &moe->experts[e], /*may_be_mxfp4=*/true);
  };
  if (sel.all_experts) {
    for (int e = 0; e < c.num_experts; ++e) K3_RETURN_IF_ERROR(load_expert(e));
  } else {
    for (int e : sel.experts) K3_RETURN_IF_ERROR(load_expert(e));
  }
  return absl::OkStatus();
}

absl::Status LoadAll(Loader& ld, const Checkpoint& ckpt, const WeightSelection& sel,
                     ModelWeights* w) {
  const ModelConfig& c = w->config;
  if (sel.attention) K3_RETURN_IF_ERROR(LoadOuterWeights(ld, ckpt, w));
  w->layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& layer = w->layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    layer.is_kda = c.IsKda(l);
    layer.is_moe = c.IsMoe(l);
    if (sel.attention) K3_RETURN_IF_ERROR(LoadLayerAttention(ld, c, p, &layer));
    if (layer.is_moe) K3_RETURN_IF_ERROR(LoadMoeBlock(ld, c, sel, p, &layer.moe));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    std::shared_ptr<const Checkpoint> checkpoint, const WeightSelection& requested,
    const std::function<void(size_t, size_t)>& progress) {
  if (checkpoint == nullptr) return absl::InvalidArgumentError("LoadWeights: no checkpoint");
  const ModelConfig& config = checkpoint->config();
  WeightSelection selection = requested;
  if (!selection.all_experts) {
    for (int e : selection.experts) {
      if (e < 0 || e >= config.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat("selected expert ", e,
                                                       " is out of range 0..",
                                                       config.num_experts - 1));
      }
    }
    std::sort(selection.experts.begin(), selection.experts.end());
    selection.experts.erase(std::unique(selection.experts.begin(), selection.experts.end()),
                            selection.experts.end());
  }
  std::optional<QuantizationIgnoreList> ignore;
  if (config.quantization.has_value()) {
    K3_ASSIGN_OR_RETURN(ignore, QuantizationIgnoreList::Create(config.quantization->ignore));
  }
  // The counting pass never touches the checkpoint's data; it fills a scratch object.
  size_t total = 0;
  {
    ModelWeights scratch;
    scratch.config = config;
    Loader counter(*checkpoint, &scratch, /*counting=*/true, 0, progress, std::nullopt);
    K3_RETURN_IF_ERROR(LoadAll(counter, *checkpoint, selection, &scratch));
    total = counter.done();
  }
  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->checkpoint = checkpoint;
  Loader loader(*checkpoint, weights.get(), /*counting=*/false, total, progress, std::move(ignore));
  K3_RETURN_IF_ERROR(LoadAll(loader, *checkpoint, selection, weights.get()));
  return weights;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    const std::string& folder, const WeightSelection& selection,
    const std::function<void(size_t, size_t)>& progress) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(folder));
  return LoadWeights(std::shared_ptr<const Checkpoint>(std::move(checkpoint)), selection, progress);
}

}  // namespace k3
