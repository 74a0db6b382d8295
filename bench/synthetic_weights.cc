#include "bench/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/bf16.h"

namespace k3 {
namespace {

constexpr int64_t kDistinct = int64_t{1} << 22;  // distinct values a pool tiles

// Draws vectors and hands out matrix views into the pools.
class Filler {
 public:
  Filler(SyntheticModel* model, uint64_t seed) : model_(model), rng_(seed) {}

  float Normal(float mean, float std) {
    // Box-Muller on the generator's bits: the numbers do not depend on the standard library.
    const double u1 = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return mean + std * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                                           std::cos(6.283185307179586 * u2));
  }
  uint64_t Bits() { return rng_(); }
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(rng_() >> 11) * 0x1.0p-53);
  }
  std::vector<float> Normals(int64_t n, float mean, float std) {
    std::vector<float> v(n);
    for (float& x : v) x = Normal(mean, std);
    return v;
  }
  std::vector<float> Uniforms(int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = Uniform(lo, hi);
    return v;
  }

  // `size` values: kDistinct draws of `draw`, tiled.
  template <typename T, typename Draw>
  void Pool(std::vector<T>* pool, int64_t size, Draw draw) {
    pool->resize(size);
    const int64_t distinct = std::min(size, kDistinct);
    for (int64_t i = 0; i < distinct; ++i) (*pool)[i] = draw();
    for (int64_t i = distinct; i < size; i += distinct) {
      std::memcpy(pool->data() + i, pool->data(), sizeof(T) * std::min(distinct, size - i));
    }
  }

  WeightMatrix Bf16(int64_t rows, int64_t cols, bool embedding = false) {
    const std::vector<uint16_t>& pool = embedding ? model_->embedding_pool : model_->linear_pool;
    WeightMatrix m;
    m.type = WeightType::kBf16;
    m.rows = rows;
    m.cols = cols;
    m.data = pool.data() + NextOffset();
    return m;
  }
  WeightMatrix Mxfp4(int64_t rows, int64_t cols, int64_t offset) {
    WeightMatrix m;
    m.type = WeightType::kMxfp4;
    m.rows = rows;
    m.cols = cols;
    m.data = model_->codes_pool.data() + offset;
    m.scales = model_->scales_pool.data() + offset / 16;
    return m;
  }
  int64_t NextOffset() { return (next_++ * 7919 * 64) % kDistinct; }

 private:
  SyntheticModel* model_;
  std::mt19937_64 rng_;
  int64_t next_ = 1;
};

GatedMlpWeights Mlp(Filler& f, int64_t width, int64_t inner) {
  return {f.Bf16(inner, width), f.Bf16(inner, width), f.Bf16(width, inner)};
}

void FillKda(Filler& f, const ModelConfig& c, KdaWeights* kda) {
  const int64_t d = c.hidden_size, width = c.KdaWidth(), head_dim = c.linear_attn.head_dim;
  const int64_t heads = c.linear_attn.num_heads, kernel = c.linear_attn.short_conv_kernel_size;
  kda->q_proj = f.Bf16(width, d);
  kda->k_proj = f.Bf16(width, d);
  kda->v_proj = f.Bf16(width, d);
  kda->q_conv = f.Uniforms(width * kernel, -0.5f, 0.5f);
  kda->k_conv = f.Uniforms(width * kernel, -0.5f, 0.5f);
  kda->v_conv = f.Uniforms(width * kernel, -0.5f, 0.5f);
  kda->f_a_proj = f.Bf16(head_dim, d);
  kda->f_b_proj = f.Bf16(width, head_dim);
  kda->dt_bias = f.Normals(width, 0.0f, 0.5f);
  kda->a_log.resize(heads);
  for (float& a : kda->a_log) a = std::log(f.Uniform(1.0f, 16.0f));
  kda->b_proj = f.Bf16(heads, d);
  if (c.linear_attn.use_full_rank_gate) {
    kda->g_proj = f.Bf16(width, d);
  } else {
    kda->g_a_proj = f.Bf16(head_dim, d);
    kda->g_b_proj = f.Bf16(width, head_dim);
  }
  kda->o_norm = f.Normals(head_dim, 1.0f, 0.1f);
  kda->o_proj = f.Bf16(d, width);
}

void FillMla(Filler& f, const ModelConfig& c, MlaWeights* mla) {
  const int64_t d = c.hidden_size, heads = c.num_attention_heads;
  const int64_t q_width = heads * c.MlaQHeadDim();
  if (c.q_lora_rank) {
    mla->q_a_proj = f.Bf16(*c.q_lora_rank, d);
    mla->q_a_layernorm = f.Normals(*c.q_lora_rank, 1.0f, 0.1f);
    mla->q_b_proj = f.Bf16(q_width, *c.q_lora_rank);
  } else {
    mla->q_proj = f.Bf16(q_width, d);
  }
  mla->kv_a_proj_with_mqa = f.Bf16(c.MlaCacheWidth(), d);
  mla->kv_a_layernorm = f.Normals(c.kv_lora_rank, 1.0f, 0.1f);
  mla->kv_b_proj = f.Bf16(heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  if (c.mla_use_output_gate) mla->g_proj = f.Bf16(heads * c.v_head_dim, d);
  mla->o_proj = f.Bf16(d, heads * c.v_head_dim);
}

void FillMoe(Filler& f, const ModelConfig& c, MoeWeights* moe) {
  const int64_t d = c.hidden_size, latent = c.ExpertWidth(), inner = c.moe_intermediate_size;
  if (c.num_shared_experts > 0) moe->shared = Mlp(f, d, c.SharedWidth());
  if (c.IsLatentMoe()) {
    moe->latent_up = f.Bf16(d, latent);
    moe->router.latent_down = f.Bf16(latent, d);
    if (c.latent_moe_use_norm) moe->router.latent_norm = f.Normals(latent, 1.0f, 0.1f);
  }
  moe->router.gate = f.Bf16(c.num_experts, d);
  moe->router.score_bias = f.Normals(c.num_experts, 0.0f, 0.05f);
  // One view for every expert of the layer (the header says why); a multiple of 512 bytes, so
  // that scales (one byte per 16 code bytes) start on whole rows' worth too.
  const int64_t offset = (f.NextOffset() / 512) * 512;
  const GatedMlpWeights expert{f.Mxfp4(inner, latent, offset), f.Mxfp4(inner, latent, offset),
                               f.Mxfp4(latent, inner, offset)};
  moe->experts.assign(c.num_experts, expert);
}

int64_t LargestMatrix(const ModelConfig& c) {
  const int64_t d = c.hidden_size, heads = c.num_attention_heads;
  int64_t largest = 0;
  for (int64_t n :
       {int64_t{c.vocab_size} * d, int64_t{c.intermediate_size} * d, int64_t{c.KdaWidth()} * d,
        int64_t{c.SharedWidth()} * d, int64_t{c.ExpertWidth()} * d, heads * c.v_head_dim * d,
        heads * c.MlaQHeadDim() * std::max<int64_t>(d, c.q_lora_rank.value_or(0)),
        heads * (c.qk_nope_head_dim + c.v_head_dim) * int64_t{c.kv_lora_rank},
        int64_t{c.MlaCacheWidth()} * d, int64_t{c.num_experts} * d}) {
    largest = std::max(largest, n);
  }
  return largest;
}

}  // namespace

SyntheticModel MakeSyntheticWeights(const ModelConfig& c, uint64_t seed) {
  SyntheticModel model;
  Filler f(&model, seed);
  const int64_t d = c.hidden_size;
  f.Pool(&model.linear_pool, LargestMatrix(c) + kDistinct,
         [&] { return FloatToBf16(f.Normal(0.0f, 0.02f)); });
  f.Pool(&model.embedding_pool, int64_t{c.vocab_size} * d + kDistinct,
         [&] { return FloatToBf16(f.Normal(0.0f, 1.0f)); });
  const int64_t expert_codes = int64_t{c.moe_intermediate_size} * c.ExpertWidth() / 2;
  f.Pool(&model.codes_pool, expert_codes + kDistinct,
         [&] { return static_cast<uint8_t>(f.Bits() >> 56); });
  // E8M0 119..121: 2^-8..2^-6, so that codes (RMS ~2.9) give values of std ~0.02.
  f.Pool(&model.scales_pool, expert_codes / 16 + kDistinct,
         [&] { return static_cast<uint8_t>(119 + f.Bits() % 3); });

  auto weights = std::make_unique<ModelWeights>();
  weights->config = c;
  weights->embed_tokens = f.Bf16(c.vocab_size, d, /*embedding=*/true);
  weights->final_norm = f.Normals(d, 1.0f, 0.1f);
  if (c.HasAttnRes()) {
    weights->output_attn_res_norm = f.Normals(d, 1.0f, 0.1f);
    weights->output_attn_res_proj = f.Normals(d, 0.0f, 0.1f);
  }
  weights->lm_head = c.tie_word_embeddings ? weights->embed_tokens : f.Bf16(c.vocab_size, d);
  weights->layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& layer = weights->layers[l];
    layer.is_kda = c.IsKda(l);
    layer.is_moe = c.IsMoe(l);
    layer.input_layernorm = f.Normals(d, 1.0f, 0.1f);
    layer.post_attention_layernorm = f.Normals(d, 1.0f, 0.1f);
    if (c.HasAttnRes()) {
      layer.attn_res_norm = f.Normals(d, 1.0f, 0.1f);
      layer.attn_res_proj = f.Normals(d, 0.0f, 0.1f);
      layer.mlp_res_norm = f.Normals(d, 1.0f, 0.1f);
      layer.mlp_res_proj = f.Normals(d, 0.0f, 0.1f);
    }
    if (layer.is_kda) {
      FillKda(f, c, &layer.kda);
    } else {
      FillMla(f, c, &layer.mla);
    }
    if (layer.is_moe) {
      FillMoe(f, c, &layer.moe);
    } else {
      layer.dense_mlp = Mlp(f, d, c.intermediate_size);
    }
  }
  model.weights = std::move(weights);
  return model;
}

}  // namespace k3
