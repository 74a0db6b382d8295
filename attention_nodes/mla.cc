#include "attention_nodes/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

enum Slot {
  kSlotQ,        // [T, H * q_head_dim]
  kSlotQLatent,  // [T, q_lora_rank]
  kSlotGate,     // [T, H * v]
  kSlotO,        // [T, H * v]
  kSlotKv,       // expanded: [N, H * (nope + v)]
  kSlotQAbs,     // absorbed: [T, H, c + r]
  kSlotLatent,   // absorbed: [T, H, c]
  kSlotPartial,  // absorbed: per (token, key split) softmax partials
};

absl::Status CheckMatrix(const WeightMatrix& m, int64_t rows, int64_t cols, const char* name) {
  if (m.empty())
    return absl::InvalidArgumentError(absl::StrCat("MLA weight ", name, " is missing"));
  if (m.rows != rows || m.cols != cols) {
    return absl::InvalidArgumentError(absl::StrCat("MLA weight ", name, " is [", m.rows, ", ",
                                                   m.cols, "], expected [", rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckVector(const std::vector<float>& v, size_t size, const char* name) {
  if (v.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLA weight ", name, " has ", v.size(), " values, expected ", size));
  }
  return absl::OkStatus();
}

#define K3_RETURN_IF_ERROR(expr)       \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (false)

absl::Status Validate(const ModelConfig& config, const MlaWeights& w, const MlaCache& cache) {
  const int64_t h = config.num_attention_heads, d = config.hidden_size;
  const int64_t qhd = config.MlaQHeadDim(), c = config.kv_lora_rank;
  const int64_t r = config.qk_rope_head_dim, vd = config.v_head_dim;
  if (cache.kv_lora_rank != c || cache.rope_dim != r ||
      cache.rows.size() < static_cast<size_t>(cache.length * cache.width()) || cache.length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLA cache is sized for kv_lora_rank ", cache.kv_lora_rank, " + rope ",
                     cache.rope_dim, " with ", cache.length, " tokens in ", cache.rows.size(),
                     " values; the config needs ", c, " + ", r));
  }
  if (config.q_lora_rank.has_value()) {
    const int64_t ql = *config.q_lora_rank;
    K3_RETURN_IF_ERROR(CheckMatrix(w.q_a_proj, ql, d, "q_a_proj"));
    K3_RETURN_IF_ERROR(CheckVector(w.q_a_layernorm, ql, "q_a_layernorm"));
    K3_RETURN_IF_ERROR(CheckMatrix(w.q_b_proj, h * qhd, ql, "q_b_proj"));
  } else {
    K3_RETURN_IF_ERROR(CheckMatrix(w.q_proj, h * qhd, d, "q_proj"));
  }
  K3_RETURN_IF_ERROR(CheckMatrix(w.kv_a_proj_with_mqa, c + r, d, "kv_a_proj_with_mqa"));
  K3_RETURN_IF_ERROR(CheckVector(w.kv_a_layernorm, c, "kv_a_layernorm"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.kv_b_proj, h * (config.qk_nope_head_dim + vd), c, "kv_b_proj"));
  if (config.mla_use_output_gate) K3_RETURN_IF_ERROR(CheckMatrix(w.g_proj, h * vd, d, "g_proj"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.o_proj, d, h * vd, "o_proj"));
  return absl::OkStatus();
}

// One block of keys of a running (online) softmax for `rows` query rows: scores [rows, ld] of
// `n` keys become the block's unnormalized weights e^{score − max}, and the rows' running max,
// sum and accumulators acc [rows, acc_ld] (width vdim) are rescaled whenever the max grows. The
// caller then adds weights · values into acc. Masked keys carry −inf and get weight 0.
void SoftmaxBlock(float* scores, int64_t ld, int64_t rows, int64_t n, float* max, float* sum,
                  float* acc, int64_t acc_ld, int64_t vdim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = scores + r * ld;
    const float block_max = *std::max_element(s, s + n);
    if (block_max == -std::numeric_limits<float>::infinity()) {  // every key masked
      std::fill_n(s, n, 0.0f);
      continue;
    }
    if (block_max > max[r]) {
      const float rescale = std::exp(max[r] - block_max);  // 0 while nothing was seen
      Scale(rescale, acc + r * acc_ld, vdim);
      sum[r] *= rescale;
      max[r] = block_max;
    }
    for (int64_t j = 0; j < n; ++j) s[j] -= max[r];
    ExpInPlace(s, n);
    float total = 0.0f;
    for (int64_t j = 0; j < n; ++j) total += s[j];
    sum[r] += total;
  }
}

// Dimensions of one call, shared by the two forms.
struct MlaDims {
  int64_t h, nope, r, qhd, vd, c, width, kv_width;
};

// Expanded form (§6.1), flash-attention style: for each (head, block of kQueryBlock queries) the
// scores against a block of keys are one small GEMM, and so is the weighted sum of values.
// q: [T, H, qhd] pre-scaled; kv: [N, H, nope + v]; rows: the cache; o: [T, H, v].
constexpr int64_t kQueryBlock = 16;
constexpr int64_t kKeyBlock = 64;

void ExpandedAttention(const MlaDims& m, const float* q, const float* kv, const float* rows,
                       int64_t start, int64_t tokens, float* o) {
  const int64_t query_blocks = (tokens + kQueryBlock - 1) / kQueryBlock;
  const int64_t kv_stride = m.h * m.kv_width;
  // Items are head-major so that consecutive items of a thread reuse one head's keys.
  ParallelFor(m.h * query_blocks, 1, [&](int64_t item0, int64_t item1) {
    std::vector<float> buffer(m.qhd * kKeyBlock + kQueryBlock * kKeyBlock + kQueryBlock * m.vd +
                              2 * kQueryBlock);
    float* keys_t = buffer.data();                  // [qhd, kKeyBlock]
    float* scores = keys_t + m.qhd * kKeyBlock;     // [kQueryBlock, kKeyBlock]
    float* acc = scores + kQueryBlock * kKeyBlock;  // [kQueryBlock, v]
    float* max = acc + kQueryBlock * m.vd;          // [kQueryBlock]
    float* sum = max + kQueryBlock;                 // [kQueryBlock]
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t head = item / query_blocks;
      const int64_t i0 = (item % query_blocks) * kQueryBlock;
      const int64_t nq = std::min(kQueryBlock, tokens - i0);
      const float* qh = q + (i0 * m.h + head) * m.qhd;
      const float* kv_head = kv + head * m.kv_width;
      std::fill_n(acc, nq * m.vd, 0.0f);
      std::fill_n(max, nq, -std::numeric_limits<float>::infinity());
      std::fill_n(sum, nq, 0.0f);
      const int64_t key_end = start + i0 + nq;  // keys the last query of the block sees
      for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, key_end - k0);
        for (int64_t j = 0; j < nk; ++j) {
          const float* k_nope = kv_head + (k0 + j) * kv_stride;
          const float* k_pe = rows + (k0 + j) * m.width + m.c;
          for (int64_t d = 0; d < m.nope; ++d) keys_t[d * kKeyBlock + j] = k_nope[d];
          for (int64_t d = 0; d < m.r; ++d) keys_t[(m.nope + d) * kKeyBlock + j] = k_pe[d];
        }
        Gemm(nq, nk, m.qhd, qh, m.h * m.qhd, keys_t, kKeyBlock, scores, kKeyBlock, false);
        for (int64_t ii = 0; ii < nq; ++ii) {  // causal mask
          const int64_t first_masked = std::max<int64_t>(start + i0 + ii + 1 - k0, 0);
          for (int64_t j = first_masked; j < nk; ++j) {
            scores[ii * kKeyBlock + j] = -std::numeric_limits<float>::infinity();
          }
        }
        SoftmaxBlock(scores, kKeyBlock, nq, nk, max, sum, acc, m.vd, m.vd);
        Gemm(nq, m.vd, nk, scores, kKeyBlock, kv_head + k0 * kv_stride + m.nope, kv_stride, acc,
             m.vd, true);
      }
      for (int64_t ii = 0; ii < nq; ++ii) {
        float* out = o + ((i0 + ii) * m.h + head) * m.vd;
        for (int64_t d = 0; d < m.vd; ++d) out[d] = acc[ii * m.vd + d] / sum[ii];
      }
    }
  });
}

// Absorbed form (§6.2) over the latent rows: for each query token, all heads read a block of
// cache rows together (scores by dot products, values by one GEMM), so a decode step streams the
// cache once rather than once per head. A single query token splits its keys across threads;
// the partial softmaxes are merged at the end.
// q_abs: [T, H, width] pre-scaled; latent: [T, H, c]. `partial` has PartialFloats(...) room.
constexpr int64_t kLatentKeyBlock = 16;
constexpr int64_t kMinKeysPerSplit = 128;

int64_t KeySplits(int64_t tokens, int64_t keys) {
  if (tokens > 1) return 1;
  const int64_t by_size = (keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return std::max<int64_t>(1, std::min<int64_t>(by_size, 2 * KernelThreadCount()));
}

int64_t PartialFloats(const MlaDims& m) { return m.h * (m.c + 2 + kLatentKeyBlock); }

void AbsorbedAttention(const MlaDims& m, const float* q_abs, const float* rows, int64_t start,
                       int64_t tokens, float* partial, float* latent) {
  const int64_t splits = KeySplits(tokens, start + tokens);
  const int64_t per_item = PartialFloats(m);
  ParallelFor(tokens * splits, 1, [&](int64_t item0, int64_t item1) {
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t i = item / splits, split = item % splits;
      const int64_t keys = start + i + 1;
      const int64_t per_split = (keys + splits - 1) / splits;
      const int64_t k_begin = std::min(keys, split * per_split);
      const int64_t k_end = std::min(keys, k_begin + per_split);
      float* acc = partial + item * per_item;  // [H, c]
      float* max = acc + m.h * m.c;            // [H]
      float* sum = max + m.h;                  // [H]
      float* scores = sum + m.h;               // [H, kLatentKeyBlock]
      std::fill_n(acc, m.h * m.c, 0.0f);
      std::fill_n(max, m.h, -std::numeric_limits<float>::infinity());
      std::fill_n(sum, m.h, 0.0f);
      const float* qi = q_abs + i * m.h * m.width;
      for (int64_t k0 = k_begin; k0 < k_end; k0 += kLatentKeyBlock) {
        const int64_t nk = std::min(kLatentKeyBlock, k_end - k0);
        for (int64_t head = 0; head < m.h; ++head) {
          for (int64_t j = 0; j < nk; ++j) {
            scores[head * kLatentKeyBlock + j] =
                Dot(qi + head * m.width, rows + (k0 + j) * m.width, m.width);
          }
        }
        SoftmaxBlock(scores, kLatentKeyBlock, m.h, nk, max, sum, acc, m.c, m.c);
        Gemm(m.h, m.c, nk, scores, kLatentKeyBlock, rows + k0 * m.width, m.width, acc, m.c, true);
      }
    }
  });
  // Merge the splits of each (token, head).
  ParallelFor(tokens * m.h, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t i = pair / m.h, head = pair % m.h;
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < splits; ++s) {
        best = std::max(best, partial[(i * splits + s) * per_item + m.h * m.c + head]);
      }
      float* out = latent + pair * m.c;
      std::fill_n(out, m.c, 0.0f);
      float total = 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        const float* item = partial + (i * splits + s) * per_item;
        const float weight = std::exp(item[m.h * m.c + head] - best);  // 0 for an empty split
        if (weight == 0.0f) continue;
        total += weight * item[m.h * m.c + m.h + head];
        Axpy(weight, item + head * m.c, out, m.c);
      }
      Scale(1.0f / total, out, m.c);
    }
  });
}

}  // namespace

MlaCache::MlaCache(const ModelConfig& config)
    : kv_lora_rank(config.kv_lora_rank), rope_dim(config.qk_rope_head_dim) {}

void MlaCache::Reserve(int64_t tokens) {
  const size_t needed = static_cast<size_t>(tokens * width());
  if (rows.size() < needed) rows.resize(needed);
}

absl::Status MlaForward(const ModelConfig& config, const MlaWeights& weights, const float* x,
                        int64_t tokens, MlaCache* cache, float* out, Scratch* scratch,
                        MlaForm form) {
  if (tokens < 0) return absl::InvalidArgumentError(absl::StrCat("MLA tokens ", tokens, " < 0"));
  K3_RETURN_IF_ERROR(Validate(config, weights, *cache));
  if (tokens == 0) return absl::OkStatus();

  const int64_t t_count = tokens;
  const int64_t h = config.num_attention_heads, d = config.hidden_size;
  const int64_t nope = config.qk_nope_head_dim, r = config.qk_rope_head_dim;
  const int64_t qhd = nope + r, vd = config.v_head_dim, c = config.kv_lora_rank;
  const int64_t width = c + r, kv_width = nope + vd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qhd));

  // Queries, pre-scaled by 1/sqrt(q_head_dim).
  float* q = scratch->Get(kSlotQ, t_count * h * qhd);
  if (config.q_lora_rank.has_value()) {
    const int64_t ql = *config.q_lora_rank;
    float* latent = scratch->Get(kSlotQLatent, t_count * ql);
    MatMul(weights.q_a_proj, x, t_count, latent);
    RmsNormRows(latent, ql, t_count, ql, weights.q_a_layernorm.data(), kMlaLatentNormEps, latent,
                ql);
    MatMul(weights.q_b_proj, latent, t_count, q);
  } else {
    MatMul(weights.q_proj, x, t_count, q);
  }
  Scale(scale, q, t_count * h * qhd);

  // Append the new tokens' [c | k_pe] rows, growing the cache geometrically.
  const int64_t start = cache->length;
  const int64_t total = start + t_count;
  if (cache->rows.size() < static_cast<size_t>(total * width)) {
    cache->Reserve(std::max<int64_t>(total, 2 * static_cast<int64_t>(cache->rows.size()) / width));
  }
  float* rows = cache->rows.data();
  MatMul(weights.kv_a_proj_with_mqa, x, d, t_count, rows + start * width, width);
  RmsNormRows(rows + start * width, width, t_count, c, weights.kv_a_layernorm.data(),
              kMlaLatentNormEps, rows + start * width, width);
  cache->length = total;

  const MlaDims dims{h, nope, r, qhd, vd, c, width, kv_width};
  float* o = scratch->Get(kSlotO, t_count * h * vd);
  const bool expanded =
      form == MlaForm::kExpanded || (form == MlaForm::kAuto && start == 0 && t_count > 1);
  if (expanded) {
    // K/V for every cached token: [N, H, nope + v] (§6.1).
    float* kv = scratch->Get(kSlotKv, total * h * kv_width);
    MatMul(weights.kv_b_proj, rows, width, total, kv, h * kv_width);
    ExpandedAttention(dims, q, kv, rows, start, t_count, o);
  } else {
    // Absorbed (§6.2): q̃_h = W_K[h]ᵀ q_nope_h next to q_pe_h, scored against whole cache rows.
    float* q_abs = scratch->Get(kSlotQAbs, t_count * h * width);
    float* latent = scratch->Get(kSlotLatent, t_count * h * c);
    float* partial =
        scratch->Get(kSlotPartial, t_count * KeySplits(t_count, total) * PartialFloats(dims));
    ParallelFor(h, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t head = h0; head < h1; ++head) {
        MatMulTransposed(weights.kv_b_proj.RowSlice(head * kv_width, nope), q + head * qhd, h * qhd,
                         t_count, q_abs + head * width, h * width);
        for (int64_t i = 0; i < t_count; ++i) {
          std::copy_n(q + (i * h + head) * qhd + nope, r, q_abs + (i * h + head) * width + c);
        }
      }
    });
    AbsorbedAttention(dims, q_abs, rows, start, t_count, partial, latent);
    ParallelFor(h, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t head = h0; head < h1; ++head) {
        MatMul(weights.kv_b_proj.RowSlice(head * kv_width + nope, vd), latent + head * c, h * c,
               t_count, o + head * vd, h * vd);
      }
    });
  }

  if (config.mla_use_output_gate) {
    float* gate = scratch->Get(kSlotGate, t_count * h * vd);
    MatMul(weights.g_proj, x, t_count, gate);
    MulSigmoid(gate, o, t_count * h * vd);
  }
  MatMul(weights.o_proj, o, t_count, out);
  return absl::OkStatus();
}

}  // namespace k3
