#include "reference/k3_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "model/safetensors.h"
#include "reference/half_bits.h"

namespace k3::reference {
namespace {

// The MLA q/kv latent norms use the RMSNorm class default, not rms_norm_eps (spec §3.1).
constexpr double kMlaLatentNormEps = 1e-6;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Reads checkpoint tensors into fp64, checking shapes. The first error sticks: later calls return
// empty values and the caller checks status() once after loading a whole sublayer.
class Loader {
 public:
  explicit Loader(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  const absl::Status& status() const { return status_; }

  // A tensor of exactly [rows, cols]; `name` may be stored as an MXFP4 pair (spec §10).
  Matrix Mat(const std::string& name, int64_t rows, int64_t cols) {
    std::optional<Vec> values = Checked(
        name, /*mxfp4_ok=*/true,
        [&](const Shape& shape, int64_t) { return shape == Shape{rows, cols}; },
        ShapeString({rows, cols}));
    if (!values) return {};
    return Matrix{rows, cols, std::move(*values)};
  }

  // A tensor of n values in any layout ([n], or [1, n] for the AttnRes queries).
  Vec Flat(const std::string& name, int64_t n) {
    std::optional<Vec> values = Checked(
        name, /*mxfp4_ok=*/false, [&](const Shape&, int64_t count) { return count == n; },
        absl::StrCat(n, " values"));
    return values ? std::move(*values) : Vec{};
  }

  // A depthwise conv weight, [C, 1, K] as PyTorch stores it or [C, K] (spec §11.2).
  Matrix Conv(const std::string& name, int64_t channels, int64_t kernel) {
    std::optional<Vec> values = Checked(
        name, /*mxfp4_ok=*/false,
        [&](const Shape& shape, int64_t) {
          return shape == Shape{channels, 1, kernel} || shape == Shape{channels, kernel};
        },
        absl::StrCat(ShapeString({channels, 1, kernel}), " or ", ShapeString({channels, kernel})));
    if (!values) return {};
    return Matrix{channels, kernel, std::move(*values)};
  }

  // A_log (spec §11.1): flattened; exactly `heads` values, or more whose tail is all zero.
  Vec ALog(const std::string& name, int64_t heads) {
    std::optional<Vec> read = Checked(
        name, /*mxfp4_ok=*/false, [&](const Shape&, int64_t count) { return count >= heads; },
        absl::StrCat("at least ", heads, " values (one per head)"));
    if (!read) return {};
    Vec& values = *read;
    for (size_t i = heads; i < values.size(); ++i) {
      if (values[i] != 0.0) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat("tensor ", name, " has ", values.size(), " values for ", heads,
                         " heads and its padding value ", i, " is ", values[i], ", not 0"));
        return {};
      }
    }
    values.resize(heads);
    return values;
  }

 private:
  using Shape = std::vector<int64_t>;

  // Tensor `name` (read as an MXFP4 pair where `mxfp4_ok` and only the pair is stored) when
  // fits(shape, value count) holds; otherwise nothing, with the error in status_ (naming the
  // `expected` shape when the tensor does not fit).
  template <typename Fits>
  std::optional<Vec> Checked(const std::string& name, bool mxfp4_ok, const Fits& fits,
                             const std::string& expected) {
    Shape shape;
    Vec values = mxfp4_ok && !ckpt_.Has(name) && ckpt_.Has(name + "_packed")
                     ? ReadMxfp4(name, &shape)
                     : Read(name, &shape);
    if (!status_.ok()) return std::nullopt;
    if (!fits(shape, static_cast<int64_t>(values.size()))) {
      Fail(name, shape, expected);
      return std::nullopt;
    }
    return values;
  }

  // Spec §10, literally: name + "_packed" holds two E2M1 codes per byte (element 2i in the low
  // nibble; bit 3 the sign), name + "_scale" one E8M0 byte per 32 inputs, value code * 2^(s-127).
  Vec ReadMxfp4(const std::string& name, std::vector<int64_t>* shape) {
    static constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    absl::StatusOr<TensorView> codes = ckpt_.Find(name + "_packed");
    absl::StatusOr<TensorView> scales = ckpt_.Find(name + "_scale");
    if (!codes.ok() || !scales.ok()) {
      status_ = codes.ok() ? scales.status() : codes.status();
      return {};
    }
    if (codes->dtype != DType::kU8 || codes->shape.size() != 2 || scales->shape.size() != 2 ||
        scales->bytes != static_cast<size_t>(scales->numel()) ||
        scales->shape[0] != codes->shape[0] || scales->shape[1] * 16 != codes->shape[1]) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          "MXFP4 tensor ", name, ": codes ", ShapeString(codes->shape), " and scales ",
          ShapeString(scales->shape), " are not [out, in/2] and [out, in/32] bytes"));
      return {};
    }
    const int64_t rows = codes->shape[0], cols = codes->shape[1] * 2;
    *shape = {rows, cols};
    Vec values(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint8_t byte = codes->data[i / 2];
      const int code = i % 2 == 0 ? byte & 0xf : byte >> 4;
      const int scale = scales->data[i / 32];  // a row's groups follow each other
      if (scale == 255) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat("MXFP4 tensor ", name, ": scale byte 255 (NaN) in row ", i / cols));
        return {};
      }
      values[i] = (code & 8 ? -1.0 : 1.0) * kE2m1[code & 7] * std::ldexp(1.0, scale - 127);
    }
    return values;
  }

  Vec Read(const std::string& name, std::vector<int64_t>* shape) {
    if (!status_.ok()) return {};
    absl::StatusOr<TensorView> view = ckpt_.Find(name);
    if (!view.ok()) {
      status_ = view.status();
      return {};
    }
    *shape = view->shape;
    const int64_t n = view->numel();
    Vec values(n);
    const uint8_t* data = view->data;
    switch (view->dtype) {
      case DType::kBf16:
      case DType::kF16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t bits;
          std::memcpy(&bits, data + 2 * i, sizeof(bits));
          values[i] = view->dtype == DType::kBf16 ? Bf16ToDouble(bits) : HalfToDouble(bits);
        }
        break;
      case DType::kF32:
        for (int64_t i = 0; i < n; ++i) {
          float v;
          std::memcpy(&v, data + 4 * i, sizeof(v));
          values[i] = v;
        }
        break;
      case DType::kF64:
        for (int64_t i = 0; i < n; ++i) std::memcpy(&values[i], data + 8 * i, sizeof(double));
        break;
      default:
        status_ = absl::InvalidArgumentError(
            absl::StrCat("tensor ", name, " in ", view->file, " has dtype ",
                         std::string(DTypeName(view->dtype)), "; expected BF16, F16, F32 or F64"));
        return {};
    }
    return values;
  }

  void Fail(const std::string& name, const std::vector<int64_t>& shape,
            const std::string& expected) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has shape ", ShapeString(shape), ", expected ", expected));
  }

  const Checkpoint& ckpt_;
  absl::Status status_;
};

absl::Status CheckSupported(const ModelConfig& c) {
  if (!c.mla_use_nope) {
    return absl::InvalidArgumentError("mla_use_nope=false (rotary MLA) is not part of the spec");
  }
  if (c.num_experts > 0) {
    if (c.moe_router_activation_func != "sigmoid") {
      return absl::InvalidArgumentError(absl::StrCat("moe_router_activation_func \"",
                                                     c.moe_router_activation_func,
                                                     "\" is not supported; the spec uses sigmoid"));
    }
    if (c.use_grouped_topk && c.num_expert_group > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_expert_group ", c.num_expert_group,
                       " > 1: group-limited routing is not part of the spec"));
    }
    if (c.num_experts_per_token < 1 || c.num_experts_per_token > c.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("num_experts_per_token ",
                                                     c.num_experts_per_token, " is not in [1, ",
                                                     c.num_experts, "]"));
    }
  }
  return absl::OkStatus();
}

GluMlpParams LoadGlu(Loader& in, const std::string& prefix, const std::string& gate,
                     const std::string& up, const std::string& down, int64_t width,
                     int64_t hidden) {
  GluMlpParams p;
  p.gate = in.Mat(prefix + gate + ".weight", hidden, width);
  p.up = in.Mat(prefix + up + ".weight", hidden, width);
  p.down = in.Mat(prefix + down + ".weight", width, hidden);
  return p;
}

KdaParams LoadKda(Loader& in, const ModelConfig& c, const std::string& prefix) {
  const int64_t d = c.hidden_size;
  const int64_t heads = c.linear_attn.num_heads;
  const int64_t dim = c.linear_attn.head_dim;
  const int64_t width = heads * dim;
  const int64_t kernel = c.linear_attn.short_conv_kernel_size;
  KdaParams p;
  p.q_proj = in.Mat(prefix + "q_proj.weight", width, d);
  p.k_proj = in.Mat(prefix + "k_proj.weight", width, d);
  p.v_proj = in.Mat(prefix + "v_proj.weight", width, d);
  p.q_conv = in.Conv(prefix + "q_conv1d.weight", width, kernel);
  p.k_conv = in.Conv(prefix + "k_conv1d.weight", width, kernel);
  p.v_conv = in.Conv(prefix + "v_conv1d.weight", width, kernel);
  p.f_a_proj = in.Mat(prefix + "f_a_proj.weight", dim, d);
  p.f_b_proj = in.Mat(prefix + "f_b_proj.weight", width, dim);
  p.dt_bias = in.Flat(prefix + "dt_bias", width);
  p.a_log = in.ALog(prefix + "A_log", heads);
  p.b_proj = in.Mat(prefix + "b_proj.weight", heads, d);
  if (c.linear_attn.use_full_rank_gate) {
    p.g_proj = in.Mat(prefix + "g_proj.weight", width, d);
  } else {
    p.g_a_proj = in.Mat(prefix + "g_a_proj.weight", dim, d);
    p.g_b_proj = in.Mat(prefix + "g_b_proj.weight", width, dim);
  }
  p.o_norm = in.Flat(prefix + "o_norm.weight", dim);
  p.o_proj = in.Mat(prefix + "o_proj.weight", d, width);
  return p;
}

MlaParams LoadMla(Loader& in, const ModelConfig& c, const std::string& prefix) {
  const int64_t d = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t q_width = heads * c.MlaQHeadDim();
  MlaParams p;
  if (c.q_lora_rank) {
    p.q_a_proj = in.Mat(prefix + "q_a_proj.weight", *c.q_lora_rank, d);
    p.q_a_layernorm = in.Flat(prefix + "q_a_layernorm.weight", *c.q_lora_rank);
    p.q_b_proj = in.Mat(prefix + "q_b_proj.weight", q_width, *c.q_lora_rank);
  } else {
    p.q_proj = in.Mat(prefix + "q_proj.weight", q_width, d);
  }
  p.kv_a_proj = in.Mat(prefix + "kv_a_proj_with_mqa.weight", c.MlaCacheWidth(), d);
  p.kv_a_layernorm = in.Flat(prefix + "kv_a_layernorm.weight", c.kv_lora_rank);
  p.kv_b_proj = in.Mat(prefix + "kv_b_proj.weight", heads * (c.qk_nope_head_dim + c.v_head_dim),
                       c.kv_lora_rank);
  if (c.mla_use_output_gate) {
    p.g_proj = in.Mat(prefix + "g_proj.weight", heads * c.v_head_dim, d);
  }
  p.o_proj = in.Mat(prefix + "o_proj.weight", d, heads * c.v_head_dim);
  return p;
}

MoeParams LoadMoe(Loader& in, const ModelConfig& c, const std::string& prefix) {
  const int64_t d = c.hidden_size;
  const int64_t width = c.ExpertWidth();
  MoeParams p;
  p.router = in.Mat(prefix + "gate.weight", c.num_experts, d);
  p.score_bias = in.Flat(prefix + "gate.e_score_correction_bias", c.num_experts);
  if (c.IsLatentMoe()) {
    p.latent_down = in.Mat(prefix + "routed_expert_down_proj.weight", width, d);
    if (c.latent_moe_use_norm) {
      p.latent_norm = in.Flat(prefix + "routed_expert_norm.weight", width);
    }
    p.latent_up = in.Mat(prefix + "routed_expert_up_proj.weight", d, width);
  }
  for (int e = 0; e < c.num_experts && in.status().ok(); ++e) {
    p.experts.push_back(LoadGlu(in, absl::StrCat(prefix, "experts.", e, "."), "w1", "w3", "w2",
                                width, c.moe_intermediate_size));
  }
  if (c.num_shared_experts > 0) {
    p.shared = LoadGlu(in, prefix + "shared_experts.", "gate_proj", "up_proj", "down_proj", d,
                       c.SharedWidth());
  }
  return p;
}

std::optional<double> LinearBeta(const ModelConfig& c) {
  if (!c.activation_situ_linear_beta) return std::nullopt;
  return static_cast<double>(*c.activation_situ_linear_beta);
}

void AddInto(Rows& acc, const Rows& delta) {
  CHECK_EQ(acc.size(), delta.size());
  for (size_t t = 0; t < acc.size(); ++t) {
    CHECK_EQ(acc[t].size(), delta[t].size());
    for (size_t i = 0; i < acc[t].size(); ++i) acc[t][i] += delta[t][i];
  }
}

Rows NormRows(const Rows& x, const Vec& gamma, double eps) {
  Rows y;
  y.reserve(x.size());
  for (const Vec& row : x) y.push_back(RmsNorm(row, gamma, eps));
  return y;
}

// The sources of an AttnRes read at position t: completed blocks, then the partial sum.
std::vector<Vec> Sources(const std::vector<Rows>& blocks, const Rows& prefix, size_t t) {
  std::vector<Vec> sources;
  for (const Rows& block : blocks) sources.push_back(block[t]);
  sources.push_back(prefix[t]);
  return sources;
}

Rows AttnResRows(const std::vector<Rows>& blocks, const Rows& prefix, const Vec& proj,
                 const Vec& norm, double eps) {
  Rows h;
  for (size_t t = 0; t < prefix.size(); ++t) {
    h.push_back(AttnRes(Sources(blocks, prefix, t), proj, norm, eps));
  }
  return h;
}

// One layer's sequence-mixing sublayer on its input h: input_layernorm, then KDA or MLA.
absl::StatusOr<Rows> MixerSublayer(const Checkpoint& ckpt, int layer, const Rows& h) {
  const ModelConfig& c = ckpt.config();
  Loader in(ckpt);
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  Vec norm = in.Flat(prefix + "input_layernorm.weight", c.hidden_size);
  if (c.IsKda(layer)) {
    KdaParams p = LoadKda(in, c, prefix + "self_attn.");
    if (!in.status().ok()) return in.status();
    return KdaForward(p, c, NormRows(h, norm, c.rms_norm_eps));
  }
  MlaParams p = LoadMla(in, c, prefix + "self_attn.");
  if (!in.status().ok()) return in.status();
  return MlaForward(p, c, NormRows(h, norm, c.rms_norm_eps));
}

// One layer's FFN sublayer on its input h: post_attention_layernorm, then the dense MLP or MoE.
absl::StatusOr<Rows> FfnSublayer(const Checkpoint& ckpt, int layer, const Rows& h) {
  const ModelConfig& c = ckpt.config();
  Loader in(ckpt);
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  Vec norm = in.Flat(prefix + "post_attention_layernorm.weight", c.hidden_size);
  Rows out;
  if (c.IsMoe(layer)) {
    MoeParams p = LoadMoe(in, c, prefix + "block_sparse_moe.");
    if (!in.status().ok()) return in.status();
    for (const Vec& row : h) out.push_back(MoeForward(p, c, RmsNorm(row, norm, c.rms_norm_eps)));
  } else {
    GluMlpParams p = LoadGlu(in, prefix + "mlp.", "gate_proj", "up_proj", "down_proj",
                             c.hidden_size, c.intermediate_size);
    if (!in.status().ok()) return in.status();
    for (const Vec& row : h) out.push_back(GluMlp(p, c, RmsNorm(row, norm, c.rms_norm_eps)));
  }
  return out;
}

AttnResQuery LoadQuery(Loader& in, const std::string& prefix, int64_t d) {
  AttnResQuery q;
  q.proj = in.Flat(prefix + "_proj.weight", d);
  q.norm = in.Flat(prefix + "_norm.weight", d);
  return q;
}

}  // namespace

Vec GluMlp(const GluMlpParams& p, const ModelConfig& config, const Vec& x) {
  Vec a = p.gate.Apply(x);
  Vec b = p.up.Apply(x);
  CHECK_EQ(a.size(), b.size());
  Vec z(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    z[i] = GluActivation(config.hidden_act, a[i], b[i], config.activation_situ_beta,
                         LinearBeta(config));
  }
  return p.down.Apply(z);
}

Vec MoeForward(const MoeParams& p, const ModelConfig& config, const Vec& x) {
  Vec scores = p.router.Apply(x);
  for (double& s : scores) s = Sigmoid(s);
  Routing routing = RouteTopK(scores, p.score_bias, config.num_experts_per_token,
                              config.moe_renormalize, config.routed_scaling_factor);
  const bool latent = p.latent_down.rows > 0;
  Vec z = latent ? p.latent_down.Apply(x) : x;
  Vec u(z.size(), 0.0);
  for (size_t j = 0; j < routing.experts.size(); ++j) {
    Vec e = GluMlp(p.experts[routing.experts[j]], config, z);
    for (size_t i = 0; i < u.size(); ++i) u[i] += routing.weights[j] * e[i];
  }
  if (!p.latent_norm.empty()) u = RmsNorm(u, p.latent_norm, config.rms_norm_eps);
  Vec y = latent ? p.latent_up.Apply(u) : u;
  if (p.shared) {
    Vec s = GluMlp(*p.shared, config, x);
    for (size_t i = 0; i < y.size(); ++i) y[i] += s[i];
  }
  return y;
}

Rows KdaForward(const KdaParams& p, const ModelConfig& config, const Rows& x) {
  const int heads = config.linear_attn.num_heads;
  const int dim = config.linear_attn.head_dim;
  std::optional<double> lower_bound;
  if (config.linear_attn.gate_lower_bound) lower_bound = *config.linear_attn.gate_lower_bound;

  Rows q = CausalConvSilu(p.q_proj.Apply(x), p.q_conv);
  Rows k = CausalConvSilu(p.k_proj.Apply(x), p.k_conv);
  Rows v = CausalConvSilu(p.v_proj.Apply(x), p.v_conv);
  Rows g, beta;
  for (const Vec& row : x) {
    Vec f = p.f_b_proj.Apply(p.f_a_proj.Apply(row));
    Vec g_row(f.size());
    for (size_t c = 0; c < f.size(); ++c) {
      g_row[c] = KdaLogDecay(f[c] + p.dt_bias[c], p.a_log[c / dim], lower_bound);
    }
    g.push_back(std::move(g_row));
    Vec b = p.b_proj.Apply(row);
    for (double& value : b) value = Sigmoid(value);
    beta.push_back(std::move(b));
  }
  Rows o = KdaRecurrence(q, k, v, g, beta, heads, dim);

  Rows out;
  for (size_t t = 0; t < x.size(); ++t) {
    Vec gate = p.g_proj.rows > 0 ? p.g_proj.Apply(x[t]) : p.g_b_proj.Apply(p.g_a_proj.Apply(x[t]));
    Vec y(static_cast<size_t>(heads) * dim);
    for (int h = 0; h < heads; ++h) {
      Vec head(o[t].begin() + h * dim, o[t].begin() + (h + 1) * dim);
      Vec normed = RmsNorm(head, p.o_norm, config.rms_norm_eps);
      for (int i = 0; i < dim; ++i) y[h * dim + i] = normed[i] * Sigmoid(gate[h * dim + i]);
    }
    out.push_back(p.o_proj.Apply(y));
  }
  return out;
}

Rows MlaForward(const MlaParams& p, const ModelConfig& config, const Rows& x) {
  const int heads = config.num_attention_heads;
  const int nope = config.qk_nope_head_dim;
  const int rope = config.qk_rope_head_dim;
  const int vdim = config.v_head_dim;
  const int latent = config.kv_lora_rank;
  const int q_dim = nope + rope;
  const double scale = 1.0 / std::sqrt(static_cast<double>(q_dim));
  const size_t steps = x.size();

  Rows q, k_pe, kv;
  for (const Vec& row : x) {
    q.push_back(p.q_a_proj.rows > 0 ? p.q_b_proj.Apply(RmsNorm(p.q_a_proj.Apply(row),
                                                               p.q_a_layernorm, kMlaLatentNormEps))
                                    : p.q_proj.Apply(row));
    Vec ckv = p.kv_a_proj.Apply(row);
    Vec c = RmsNorm(Vec(ckv.begin(), ckv.begin() + latent), p.kv_a_layernorm, kMlaLatentNormEps);
    k_pe.emplace_back(ckv.begin() + latent, ckv.end());
    kv.push_back(p.kv_b_proj.Apply(c));
  }

  Rows out;
  for (size_t t = 0; t < steps; ++t) {
    Vec o(static_cast<size_t>(heads) * vdim, 0.0);
    for (int h = 0; h < heads; ++h) {
      const double* q_h = q[t].data() + h * q_dim;
      std::vector<double> scores(t + 1);
      for (size_t j = 0; j <= t; ++j) {
        const double* kv_h = kv[j].data() + h * (nope + vdim);
        double dot = 0.0;
        for (int i = 0; i < nope; ++i) dot += q_h[i] * kv_h[i];
        for (int i = 0; i < rope; ++i) dot += q_h[nope + i] * k_pe[j][i];
        scores[j] = dot * scale;
      }
      double max_score = *std::max_element(scores.begin(), scores.end());
      double total = 0.0;
      for (double& s : scores) {
        s = std::exp(s - max_score);
        total += s;
      }
      for (size_t j = 0; j <= t; ++j) {
        const double* v_h = kv[j].data() + h * (nope + vdim) + nope;
        for (int i = 0; i < vdim; ++i) o[h * vdim + i] += scores[j] / total * v_h[i];
      }
    }
    if (p.g_proj.rows > 0) {
      Vec gate = p.g_proj.Apply(x[t]);
      for (size_t i = 0; i < o.size(); ++i) o[i] *= Sigmoid(gate[i]);
    }
    out.push_back(p.o_proj.Apply(o));
  }
  return out;
}

absl::StatusOr<Rows> AttnResStack(const Rows& embedding, int block_size,
                                  const AttnResQueries& queries, double eps, const Sublayer& mixer,
                                  const Sublayer& ffn) {
  CHECK_GT(block_size, 0);
  CHECK_EQ(queries.mixer.size(), queries.ffn.size());
  const int layers = static_cast<int>(queries.mixer.size());
  std::vector<Rows> blocks;  // write-once snapshots: b_0 = embedding, then completed block sums
  Rows prefix = embedding;   // the running sum of the current block
  bool prefix_empty = false;
  for (int l = 0; l < layers; ++l) {
    const AttnResQuery& mq = queries.mixer[l];
    Rows mixer_in = blocks.empty() ? prefix : AttnResRows(blocks, prefix, mq.proj, mq.norm, eps);
    if (l % block_size == 0) {
      blocks.push_back(std::move(prefix));
      prefix_empty = true;
    }
    K3_ASSIGN_OR_RETURN(Rows a, mixer(l, mixer_in));
    if (prefix_empty) {
      prefix = std::move(a);
      prefix_empty = false;
    } else {
      AddInto(prefix, a);
    }
    const AttnResQuery& fq = queries.ffn[l];
    K3_ASSIGN_OR_RETURN(Rows f, ffn(l, AttnResRows(blocks, prefix, fq.proj, fq.norm, eps)));
    AddInto(prefix, f);
  }
  return AttnResRows(blocks, prefix, queries.output.proj, queries.output.norm, eps);
}

absl::StatusOr<std::vector<double>> ReferenceLogits(const Checkpoint& ckpt,
                                                    const std::vector<int32_t>& tokens) {
  const ModelConfig& c = ckpt.config();
  K3_RETURN_IF_ERROR(CheckSupported(c));
  if (tokens.empty()) return absl::InvalidArgumentError("ReferenceLogits: empty token sequence");
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[t], " at position ", t,
                                                     " is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  const int64_t d = c.hidden_size;
  const double eps = c.rms_norm_eps;

  Rows x;
  {
    Loader in(ckpt);
    Matrix embed = in.Mat("model.embed_tokens.weight", c.vocab_size, d);
    if (!in.status().ok()) return in.status();
    for (int32_t id : tokens) {
      x.emplace_back(embed.data.begin() + id * d, embed.data.begin() + (id + 1) * d);
    }
  }

  Sublayer mixer = [&ckpt](int layer, const Rows& h) { return MixerSublayer(ckpt, layer, h); };
  Sublayer ffn = [&ckpt](int layer, const Rows& h) { return FfnSublayer(ckpt, layer, h); };
  Rows h;  // the input of the final norm
  if (c.HasAttnRes()) {
    Loader in(ckpt);
    AttnResQueries queries;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      queries.mixer.push_back(LoadQuery(in, p + "self_attention_res", d));
      queries.ffn.push_back(LoadQuery(in, p + "mlp_res", d));
    }
    queries.output = LoadQuery(in, "model.output_attn_res", d);
    if (!in.status().ok()) return in.status();
    K3_ASSIGN_OR_RETURN(Rows out,
                        AttnResStack(x, *c.attn_res_block_size, queries, eps, mixer, ffn));
    h = std::move(out);
  } else {
    // Kimi Linear: the plain residual stream (spec §12.5).
    h = std::move(x);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      K3_ASSIGN_OR_RETURN(Rows a, mixer(l, h));
      AddInto(h, a);
      K3_ASSIGN_OR_RETURN(Rows f, ffn(l, h));
      AddInto(h, f);
    }
  }

  Loader in(ckpt);
  Vec final_norm = in.Flat("model.norm.weight", d);
  Matrix lm_head = in.Mat(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                          c.vocab_size, d);
  if (!in.status().ok()) return in.status();
  std::vector<double> logits;
  logits.reserve(h.size() * c.vocab_size);
  for (const Vec& row : h) {
    Vec row_logits = lm_head.Apply(RmsNorm(row, final_norm, eps));
    logits.insert(logits.end(), row_logits.begin(), row_logits.end());
  }
  return logits;
}

}  // namespace k3::reference
