#include "model/random_checkpoint.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/text_file.h"
#include "kernels/bf16.h"
#include "kernels/mxfp4.h"
#include "kernels/thread_pool.h"
#include "model/json_value.h"
#include "model/mxfp4_quantize.h"

namespace k3 {
namespace {

constexpr char kPrefix[] = "language_model.";
// Elements per independent random stream: chunks can be generated in any order.
constexpr int64_t kChunk = 1 << 16;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NameHash(std::string_view name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in [0, 1) from the top 53 bits.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1p-53; }

// Natural log for x in (0, 1], from the exponent and an atanh series on the mantissa (error below
// 1e-7): our own arithmetic, so samples do not depend on the C library's logf.
inline float Log(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Mantissa in [1, 2); above sqrt(2) halve it (one less in the exponent field) and count it in
  // the exponent, so the series argument stays small.
  const uint32_t mantissa = (bits & 0x7fffff) | 0x3f800000;
  const uint32_t high = mantissa > 0x3fb504f3 ? 1 : 0;
  const float m = std::bit_cast<float>(mantissa - (high << 23));  // [0.71, 1.41]
  const int32_t exponent = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(high);
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  const float series =
      1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9))));
  return 2.0f * s * series + static_cast<float>(exponent) * 0.693147180559945f;
}

// Two standard normals from one 64-bit draw (24 bits for each uniform, which cuts the tails at
// 5.8 sigma). The arithmetic is ours (Log above, Taylor sin/cos on a quadrant) and branch-free,
// with quadrant fix-ups done on the bits, so the loop over pairs vectorizes.
inline void BoxMuller(uint32_t high, uint32_t low, float* pair) {
  constexpr float kHalfPi = 1.57079632679489662f;
  const float u1 = static_cast<float>(static_cast<int32_t>((high >> 8) + 1)) * 0x1p-24f;  // (0, 1]
  const float u2 = static_cast<float>(static_cast<int32_t>(low >> 8)) * 0x1p-24f;         // [0, 1)
  const float radius = std::sqrt(-2.0f * Log(u1));
  const uint32_t quadrant = low >> 30;  // the top two bits of u2
  const float theta = (4.0f * u2 - static_cast<float>(quadrant)) * kHalfPi;  // [0, pi/2)
  const float t2 = theta * theta;
  const float sin_t =
      theta * (1 - t2 * (1.0f / 6) *
                       (1 - t2 * (1.0f / 20) *
                                (1 - t2 * (1.0f / 42) *
                                         (1 - t2 * (1.0f / 72) * (1 - t2 * (1.0f / 110))))));
  const float cos_t =
      1 - t2 * 0.5f *
              (1 - t2 * (1.0f / 12) *
                       (1 - t2 * (1.0f / 30) *
                                (1 - t2 * (1.0f / 56) *
                                         (1 - t2 * (1.0f / 90) * (1 - t2 * (1.0f / 132))))));
  // cos(q*pi/2 + theta), sin(q*pi/2 + theta): odd quadrants swap sin and cos; quadrants 1 and 2
  // negate the cosine, 2 and 3 the sine.
  const uint32_t swap = 0u - (quadrant & 1);
  const uint32_t c = std::bit_cast<uint32_t>(cos_t), s = std::bit_cast<uint32_t>(sin_t);
  const uint32_t cos_bits = ((c & ~swap) | (s & swap)) ^ (((quadrant + 1) & 2) << 30);
  const uint32_t sin_bits = ((s & ~swap) | (c & swap)) ^ ((quadrant & 2) << 30);
  pair[0] = radius * std::bit_cast<float>(cos_bits);
  pair[1] = radius * std::bit_cast<float>(sin_bits);
}

// Fills out[0, n) with standard normals.
void Normals(std::mt19937_64& rng, float* out, int64_t n) {
  static thread_local std::vector<uint32_t> draws;  // high and low halves of one draw per pair
  const int64_t pairs = (n + 1) / 2;
  draws.resize(2 * pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint64_t r = rng();
    draws[2 * p] = static_cast<uint32_t>(r >> 32);
    draws[2 * p + 1] = static_cast<uint32_t>(r);
  }
  for (int64_t p = 0; p < n / 2; ++p) BoxMuller(draws[2 * p], draws[2 * p + 1], out + 2 * p);
  if (n % 2 == 1) {
    float pair[2];
    BoxMuller(draws[n - 1], draws[n], pair);
    out[n - 1] = pair[0];
  }
}

bool IsK3(const ModelConfig& c) { return c.model_type == "kimi_k3"; }

bool AlwaysF32(TensorInit init) {
  return init == TensorInit::kALog || init == TensorInit::kDtBias ||
         init == TensorInit::kScoreBias;
}

void Add(std::vector<TensorSlot>* out, std::string name, std::vector<int64_t> shape,
         TensorInit init, int layer = -1, int expert = -1) {
  out->push_back({std::move(name), std::move(shape), init, layer, expert});
}

// Adds tensors of one layer to a layout, named "model.layers.{layer}." + name.
class LayerTensors {
 public:
  LayerTensors(std::vector<TensorSlot>* out, int layer)
      : out_(out), layer_(layer), prefix_(absl::StrCat("model.layers.", layer, ".")) {}

  void operator()(const std::string& name, std::vector<int64_t> shape, TensorInit init,
                  int expert = -1) const {
    Add(out_, prefix_ + name, std::move(shape), init, layer_, expert);
  }

 private:
  std::vector<TensorSlot>* out_;
  int layer_;
  std::string prefix_;
};

// The KDA mixer's tensors (spec §5).
void AddKdaTensors(const ModelConfig& c, const LayerTensors& add) {
  using I = TensorInit;
  const int64_t d = c.hidden_size, heads = c.linear_attn.num_heads;
  const int64_t head_dim = c.linear_attn.head_dim, width = c.KdaWidth();
  const int64_t kernel = c.linear_attn.short_conv_kernel_size;
  for (const char* proj : {"q", "k", "v"}) {
    add(absl::StrCat("self_attn.", proj, "_proj.weight"), {width, d}, I::kLinear);
  }
  for (const char* conv : {"q", "k", "v"}) {
    add(absl::StrCat("self_attn.", conv, "_conv1d.weight"), {width, 1, kernel}, I::kConv);
  }
  add("self_attn.f_a_proj.weight", {head_dim, d}, I::kLinear);
  add("self_attn.f_b_proj.weight", {width, head_dim}, I::kLinear);
  add("self_attn.dt_bias", {width}, I::kDtBias);
  add("self_attn.A_log", IsK3(c) ? std::vector<int64_t>{heads} : std::vector<int64_t>{1, 1, heads, 1},
      I::kALog);
  add("self_attn.b_proj.weight", {heads, d}, I::kLinear);
  if (c.linear_attn.use_full_rank_gate) {
    add("self_attn.g_proj.weight", {width, d}, I::kLinear);
  } else {
    add("self_attn.g_a_proj.weight", {head_dim, d}, I::kLinear);
    add("self_attn.g_b_proj.weight", {width, head_dim}, I::kLinear);
  }
  add("self_attn.o_norm.weight", {head_dim}, I::kNorm);
  add("self_attn.o_proj.weight", {d, width}, I::kLinear);
}

// The MLA mixer's tensors (spec §6).
void AddMlaTensors(const ModelConfig& c, const LayerTensors& add) {
  using I = TensorInit;
  const int64_t d = c.hidden_size, mla_heads = c.num_attention_heads;
  const int64_t q_width = mla_heads * c.MlaQHeadDim();
  if (c.q_lora_rank) {
    add("self_attn.q_a_proj.weight", {*c.q_lora_rank, d}, I::kLinear);
    add("self_attn.q_a_layernorm.weight", {*c.q_lora_rank}, I::kNorm);
    add("self_attn.q_b_proj.weight", {q_width, *c.q_lora_rank}, I::kLinear);
  } else {
    add("self_attn.q_proj.weight", {q_width, d}, I::kLinear);
  }
  add("self_attn.kv_a_proj_with_mqa.weight", {c.MlaCacheWidth(), d}, I::kLinear);
  add("self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, I::kNorm);
  add("self_attn.kv_b_proj.weight",
      {mla_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, I::kLinear);
  if (c.mla_use_output_gate) {
    add("self_attn.g_proj.weight", {mla_heads * c.v_head_dim, d}, I::kLinear);
  }
  add("self_attn.o_proj.weight", {d, mla_heads * c.v_head_dim}, I::kLinear);
}

// A MoE layer's router, latent projections, routed experts and shared experts (spec §7).
void AddMoeTensors(const ModelConfig& c, const LayerTensors& add) {
  using I = TensorInit;
  const int64_t d = c.hidden_size, latent = c.ExpertWidth();
  add("block_sparse_moe.gate.weight", {c.num_experts, d}, I::kLinear);
  add("block_sparse_moe.gate.e_score_correction_bias", {c.num_experts}, I::kScoreBias);
  if (c.IsLatentMoe()) {
    add("block_sparse_moe.routed_expert_down_proj.weight", {latent, d}, I::kLinear);
    if (c.latent_moe_use_norm) add("block_sparse_moe.routed_expert_norm.weight", {latent}, I::kNorm);
    add("block_sparse_moe.routed_expert_up_proj.weight", {d, latent}, I::kLinear);
  }
  for (int e = 0; e < c.num_experts; ++e) {
    const std::string x = absl::StrCat("block_sparse_moe.experts.", e, ".");
    add(x + "w1.weight", {c.moe_intermediate_size, latent}, I::kLinear, e);
    add(x + "w3.weight", {c.moe_intermediate_size, latent}, I::kLinear, e);
    add(x + "w2.weight", {latent, c.moe_intermediate_size}, I::kLinear, e);
  }
  if (c.num_shared_experts > 0) {
    add("block_sparse_moe.shared_experts.gate_proj.weight", {c.SharedWidth(), d}, I::kLinear);
    add("block_sparse_moe.shared_experts.up_proj.weight", {c.SharedWidth(), d}, I::kLinear);
    add("block_sparse_moe.shared_experts.down_proj.weight", {d, c.SharedWidth()}, I::kLinear);
  }
}

// One tensor of a file: a slot whole, or (MXFP4) the codes or the scales of a routed expert.
enum class Part { kWhole, kCodes, kScales };
struct FileTensor {
  int64_t slot;
  Part part;
};

std::string FileBytes(const std::vector<float>& values, DType dtype) {
  std::string bytes(values.size() * DTypeSize(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      uint16_t bits = dtype == DType::kBf16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
      std::memcpy(&bytes[2 * i], &bits, 2);
    }
  }
  return bytes;
}

// The options' own checks, before anything is written.
absl::Status CheckOptions(const ModelConfig& config, const RandomCheckpointOptions& options) {
  K3_RETURN_IF_ERROR(ValidateModelConfig(config));
  if (options.dtype != DType::kBf16 && options.dtype != DType::kF16 &&
      options.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("random checkpoint dtype must be BF16, F16 or "
                                                   "F32, got ",
                                                   Sv(DTypeName(options.dtype))));
  }
  for (int e : options.hot_experts) {
    if (e < 0 || e >= config.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("hot expert ", e, " is out of range 0..", config.num_experts - 1));
    }
  }
  return absl::OkStatus();
}

// The tensors the files hold, in layout order: each slot whole, except that with `mxfp4` a routed
// expert becomes its codes followed by its scales.
absl::StatusOr<std::vector<FileTensor>> ListFileTensors(const std::vector<TensorSlot>& layout,
                                                        bool mxfp4) {
  std::vector<FileTensor> tensors;
  for (int64_t i = 0; i < static_cast<int64_t>(layout.size()); ++i) {
    if (mxfp4 && layout[i].expert >= 0) {
      if (layout[i].shape[1] % kMxfp4Group != 0) {
        return absl::InvalidArgumentError(absl::StrCat("MXFP4 needs expert widths divisible by ",
                                                       kMxfp4Group, "; ", layout[i].name, " has ",
                                                       layout[i].shape[1], " inputs"));
      }
      tensors.push_back({i, Part::kCodes});
      tensors.push_back({i, Part::kScales});
    } else {
      tensors.push_back({i, Part::kWhole});
    }
  }
  return tensors;
}

// The file tensors of a checkpoint and how each is stored: names get the prefix; whole slots the
// checkpoint's dtype, except the parameters the release keeps in F32; MXFP4 codes (two per byte)
// and scales (one per group) are U8 beside the expert's name with "weight" replaced.
struct FilePlan {
  const std::vector<TensorSlot>& layout;
  std::vector<FileTensor> tensors;
  std::string prefix;
  DType dtype;

  TensorSpec Spec(const FileTensor& t) const {
    const TensorSlot& slot = layout[t.slot];
    constexpr std::string_view kWeight = "weight";
    const std::string base = slot.name.substr(0, slot.name.size() - kWeight.size());
    switch (t.part) {
      case Part::kCodes:
        return TensorSpec{
            prefix + base + "weight_packed", DType::kU8, {slot.shape[0], slot.shape[1] / 2}};
      case Part::kScales:
        return TensorSpec{prefix + base + "weight_scale",
                          DType::kU8,
                          {slot.shape[0], slot.shape[1] / kMxfp4Group}};
      default:
        return TensorSpec{prefix + slot.name, AlwaysF32(slot.init) ? DType::kF32 : dtype,
                          slot.shape};
    }
  }

  uint64_t Bytes(const FileTensor& t) const {
    const TensorSpec spec = Spec(t);
    uint64_t n = DTypeSize(spec.dtype);
    for (int64_t d : spec.shape) n *= d;
    return n;
  }

  uint64_t TotalBytes() const {
    uint64_t total = 0;
    for (const FileTensor& t : tensors) total += Bytes(t);
    return total;
  }
};

// Contiguous runs of the plan's tensors (indices) per shard, balanced by bytes, none empty.
std::vector<std::vector<int64_t>> AssignShards(const FilePlan& plan, int shards,
                                               uint64_t total_bytes) {
  const int64_t file_count = static_cast<int64_t>(plan.tensors.size());
  std::vector<std::vector<int64_t>> shard_tensors(shards);
  uint64_t written = 0;
  int shard = 0;
  for (int64_t i = 0; i < file_count; ++i) {
    const bool current_used = !shard_tensors[shard].empty();
    const bool past_target = written * shards >= (shard + 1) * total_bytes;
    const bool must_move = file_count - i <= shards - 1 - shard;
    if (current_used && shard + 1 < shards && (past_target || must_move)) ++shard;
    shard_tensors[shard].push_back(i);
    written += plan.Bytes(plan.tensors[i]);
  }
  return shard_tensors;
}

// Writes the safetensors files, drawing each tensor's values only when the writer asks for its
// bytes, so that memory stays near the largest tensor. Returns the index's weight_map entries.
absl::StatusOr<std::string> WriteShardFiles(const std::string& dir, const FilePlan& plan,
                                            const std::vector<std::vector<int64_t>>& shard_tensors,
                                            uint64_t seed, const RandomCheckpointOptions& options) {
  const int shards = static_cast<int>(shard_tensors.size());
  std::string weight_map;
  // An expert's codes and scales follow each other (perhaps across a shard boundary): quantize
  // once for both.
  Mxfp4Bytes quantized;
  int64_t quantized_slot = -1;
  for (int s = 0; s < shards; ++s) {
    const std::string file = shards == 1
                                 ? std::string("model.safetensors")
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<TensorSpec> specs;
    for (int64_t i : shard_tensors[s]) {
      specs.push_back(plan.Spec(plan.tensors[i]));
      if (!weight_map.empty()) weight_map += ",\n";
      weight_map += "    ";
      json::AppendQuoted(specs.back().name, &weight_map);
      weight_map += ": ";
      json::AppendQuoted(file, &weight_map);
    }
    const std::function<absl::Status(size_t, std::string*)> produce = [&](size_t index,
                                                                          std::string* bytes) {
      const FileTensor& t = plan.tensors[shard_tensors[s][index]];
      const TensorSlot& slot = plan.layout[t.slot];
      if (t.part == Part::kWhole) {
        *bytes = FileBytes(RandomTensorValues(slot, seed, options), plan.Spec(t).dtype);
        return absl::OkStatus();
      }
      if (quantized_slot != t.slot) {
        quantized = QuantizeMxfp4(RandomTensorValues(slot, seed, options).data(), slot.shape[0],
                                  slot.shape[1]);
        quantized_slot = t.slot;
      }
      *bytes = t.part == Part::kCodes ? quantized.codes : quantized.scales;
      return absl::OkStatus();
    };
    K3_RETURN_IF_ERROR(WriteSafetensorsStreaming(
        dir + "/" + file, specs, options.headers_only ? nullptr : produce, {{"format", "pt"}}));
  }
  return weight_map;
}

// Sharded checkpoints get model.safetensors.index.json. A file of the other layout left by an
// earlier run would shadow or confuse this one, so it goes.
absl::Status WriteIndexOrRemoveStale(const std::string& dir, int shards, uint64_t total_bytes,
                                     const std::string& weight_map) {
  std::error_code error;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (shards == 1) {
    std::filesystem::remove(index_path, error);
    return absl::OkStatus();
  }
  std::filesystem::remove(dir + "/model.safetensors", error);
  return WriteTextFile(index_path,
                       absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total_bytes,
                                    "},\n  \"weight_map\": {\n", weight_map, "\n  }\n}\n"));
}

}  // namespace

int64_t TensorSlot::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSlot> CheckpointLayout(const ModelConfig& c) {
  using I = TensorInit;
  const int64_t d = c.hidden_size;
  std::vector<TensorSlot> out;
  Add(&out, "model.embed_tokens.weight", {c.vocab_size, d}, I::kEmbedding);
  Add(&out, "model.norm.weight", {d}, I::kNorm);
  if (c.HasAttnRes()) {
    Add(&out, "model.output_attn_res_norm.weight", {d}, I::kNorm);
    Add(&out, "model.output_attn_res_proj.weight", {1, d}, I::kResProj);
  }
  if (!c.tie_word_embeddings) Add(&out, "lm_head.weight", {c.vocab_size, d}, I::kLinear);

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerTensors add(&out, l);
    add("input_layernorm.weight", {d}, I::kNorm);
    add("post_attention_layernorm.weight", {d}, I::kNorm);
    if (c.HasAttnRes()) {
      add("self_attention_res_norm.weight", {d}, I::kNorm);
      add("self_attention_res_proj.weight", {1, d}, I::kResProj);
      add("mlp_res_norm.weight", {d}, I::kNorm);
      add("mlp_res_proj.weight", {1, d}, I::kResProj);
    }
    if (c.IsKda(l)) {
      AddKdaTensors(c, add);
    } else {
      AddMlaTensors(c, add);
    }
    if (c.IsMoe(l)) {
      AddMoeTensors(c, add);
    } else {
      add("mlp.gate_proj.weight", {c.intermediate_size, d}, I::kLinear);
      add("mlp.up_proj.weight", {c.intermediate_size, d}, I::kLinear);
      add("mlp.down_proj.weight", {d, c.intermediate_size}, I::kLinear);
    }
  }
  return out;
}

std::vector<float> RandomTensorValues(const TensorSlot& slot, uint64_t seed,
                                      const RandomCheckpointOptions& options) {
  const int64_t n = slot.numel();
  std::vector<float> values(n);
  const uint64_t base = Mix(Mix(seed) ^ NameHash(slot.name));
  float scale = 1.0f, shift = 0.0f;  // of the normal inits
  switch (slot.init) {
    case TensorInit::kLinear: scale = options.linear_std; break;
    case TensorInit::kResProj: scale = 0.1f; break;
    case TensorInit::kNorm: scale = 0.1f; shift = 1.0f; break;
    case TensorInit::kDtBias: scale = 0.5f; break;
    case TensorInit::kScoreBias: scale = 0.05f; break;
    default: break;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  ParallelFor(chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t chunk = first; chunk < last; ++chunk) {
      std::mt19937_64 rng(Mix(base + static_cast<uint64_t>(chunk)));
      float* out = values.data() + chunk * kChunk;
      const int64_t count = std::min(kChunk, n - chunk * kChunk);
      if (slot.init == TensorInit::kALog) {
        for (int64_t i = 0; i < count; ++i) {
          out[i] = static_cast<float>(std::log(1 + 15 * Uniform(rng)));
        }
      } else if (slot.init == TensorInit::kConv) {
        for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(Uniform(rng) - 0.5);
      } else {
        Normals(rng, out, count);
        for (int64_t i = 0; i < count; ++i) out[i] = shift + scale * out[i];
      }
    }
  });
  constexpr std::string_view kGate = "block_sparse_moe.gate.weight";
  if (!options.hot_experts.empty() && slot.shape.size() == 2 &&
      std::string_view(slot.name).ends_with(kGate)) {
    const int64_t rows = slot.shape[0], cols = slot.shape[1];
    for (int e : options.hot_experts) {
      if (e < 0 || e >= rows) continue;
      for (int64_t i = 0; i < cols; ++i) values[e * cols + i] *= options.hot_gate_scale;
    }
  }
  return values;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;     // NaN
  if (magnitude >= 0x477ff000) return sign | 0x7c00;    // rounds to infinity (>= 65520)
  if (magnitude < 0x38800000) {                         // below 2^-14: subnormal half
    float abs_value;
    std::memcpy(&abs_value, &magnitude, 4);
    // Scaling by 2^24 is exact; nearbyint rounds half to even. 1024 encodes the smallest normal.
    return sign | static_cast<uint16_t>(std::nearbyint(abs_value * 0x1p24f));
  }
  uint32_t half = ((magnitude >> 23) - 127 + 15) << 10 | (magnitude & 0x7fffff) >> 13;
  const uint32_t rest = magnitude & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // a carry bumps the exponent
  return sign | static_cast<uint16_t>(half);
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                   int shards) {
  RandomCheckpointOptions options;
  options.shards = shards;
  return WriteRandomCheckpoint(config, seed, dir, options);
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                   const RandomCheckpointOptions& options) {
  K3_RETURN_IF_ERROR(CheckOptions(config, options));
  const std::vector<TensorSlot> layout = CheckpointLayout(config);
  const int64_t count = static_cast<int64_t>(layout.size());
  if (options.shards < 1 || options.shards > count) {
    return absl::InvalidArgumentError(absl::StrCat("shards must be in 1..", count, " (tensors), got ",
                                                   options.shards));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));

  K3_ASSIGN_OR_RETURN(std::vector<FileTensor> tensors, ListFileTensors(layout, options.mxfp4));
  const FilePlan plan{layout, std::move(tensors),
                      options.language_model_prefix.value_or(IsK3(config)) ? kPrefix : "",
                      options.dtype};
  ModelConfig written_config = config;
  if (options.mxfp4) written_config.quantization = K3ReleaseQuantization();
  K3_RETURN_IF_ERROR(WriteTextFile(dir + "/config.json", ModelConfigToJson(written_config)));
  const uint64_t total_bytes = plan.TotalBytes();
  K3_ASSIGN_OR_RETURN(
      const std::string weight_map,
      WriteShardFiles(dir, plan, AssignShards(plan, options.shards, total_bytes), seed, options));
  return WriteIndexOrRemoveStale(dir, options.shards, total_bytes, weight_map);
}

int64_t ActiveParameters(const ModelConfig& config) {
  int64_t total = 0, routed = 0, embedding = 0;
  for (const TensorSlot& slot : CheckpointLayout(config)) {
    total += slot.numel();
    if (slot.expert >= 0) routed += slot.numel();
    if (slot.name == "model.embed_tokens.weight") embedding = slot.numel();
  }
  const int64_t per_expert = config.num_experts > 0 ? routed / config.num_experts : 0;
  return total - routed + per_expert * config.num_experts_per_token - embedding;
}

}  // namespace k3
