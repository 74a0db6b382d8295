#include "attention_nodes/forward/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/batch_invariance.h"
#include "base/status_macros.h"
#include "kernels/fp32_products.h"
#include "kernels/matmul_transposed.h"
#include "kernels/rms_norm.h"
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
  kSlotCkv,      // [T, c + r] the new cache rows
  kSlotPacked,   // absorbed: q rows, then O rows, of the absorbed sequences
};

enum IntsSlot {
  kIntsFirstRow,
  kIntsStart,
  kIntsExpanded,
  kIntsPackedRow,
  kIntsFirstItem,
  kIntsKeysBefore,
};

absl::Status CheckMatrix(const WeightMatrix& m, int64_t rows, int64_t cols, const char* name) {
  return CheckWeightMatrix("MLA", m, rows, cols, name);
}

absl::Status CheckVector(const std::vector<float>& v, size_t size, const char* name) {
  return CheckWeightVector("MLA", v, size, name);
}

// Dimensions of one call (DimsOf), shared by the checks and the two forms.
struct MlaDims {
  int64_t h, nope, r, qhd, vd, c, width, kv_width;
};

MlaDims DimsOf(const ModelConfig& config) {
  const int64_t nope = config.qk_nope_head_dim, r = config.qk_rope_head_dim;
  const int64_t vd = config.v_head_dim, c = config.kv_lora_rank;
  return MlaDims{config.num_attention_heads, nope, r, nope + r, vd, c, c + r, nope + vd};
}

// `m`: DimsOf(config).
absl::Status Validate(const ModelConfig& config, const MlaDims& m, const MlaWeights& w,
                      const MlaCache& cache) {
  const int64_t h = m.h, d = config.hidden_size, qhd = m.qhd, c = m.c, r = m.r, vd = m.vd;
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
  K3_RETURN_IF_ERROR(CheckMatrix(w.kv_b_proj, h * m.kv_width, c, "kv_b_proj"));
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
    const float block_max = MaxOf(s, n);
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
    sum[r] += ExpShiftedSum(s, n, max[r]);
  }
}

// Expanded form (§6.1), flash-attention style. A work item is one head and a run of up to
// kQueryChunk queries; it walks the keys in blocks, packs each block's keys once (transposed, so
// the scores are one small GEMM per block of kQueryBlock queries) and adds the softmax-weighted
// values (another GEMM) straight into o, which holds the running sums until the final division.
// q: [T, H, qhd] pre-scaled; kv: [N, H, nope + v]; rows: the cache; o: [T, H, v].
constexpr int64_t kQueryChunk = 256;
constexpr int64_t kQueryBlock = 16;
constexpr int64_t kKeyBlock = 64;

void ExpandedAttention(const MlaDims& m, const float* q, const float* kv, const float* rows,
                       int64_t start, int64_t tokens, float* o) {
  const int64_t chunks = (tokens + kQueryChunk - 1) / kQueryChunk;
  const int64_t kv_stride = m.h * m.kv_width, o_stride = m.h * m.vd;
  // Items are head-major so that consecutive items of a thread reuse one head's keys. Prefill
  // only, so one buffer per range of items is no burden.
  ParallelFor(m.h * chunks, 1, [&](int64_t item0, int64_t item1) {
    std::vector<float> buffer(m.qhd * kKeyBlock + kQueryBlock * kKeyBlock + 2 * kQueryChunk);
    float* keys_t = buffer.data();                  // [qhd, kKeyBlock]
    float* scores = keys_t + m.qhd * kKeyBlock;     // [kQueryBlock, kKeyBlock]
    float* max = scores + kQueryBlock * kKeyBlock;  // [kQueryChunk]
    float* sum = max + kQueryChunk;                 // [kQueryChunk]
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t head = item / chunks;
      const int64_t q0 = (item % chunks) * kQueryChunk;
      const int64_t q1 = std::min(tokens, q0 + kQueryChunk);
      const float* kv_head = kv + head * m.kv_width;
      for (int64_t i = q0; i < q1; ++i) std::fill_n(o + i * o_stride + head * m.vd, m.vd, 0.0f);
      std::fill_n(max, q1 - q0, -std::numeric_limits<float>::infinity());
      std::fill_n(sum, q1 - q0, 0.0f);
      const int64_t key_end = start + q1;  // keys the last query sees
      for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, key_end - k0);
        for (int64_t j = 0; j < nk; ++j) {
          const float* k_nope = kv_head + (k0 + j) * kv_stride;
          const float* k_pe = rows + (k0 + j) * m.width + m.c;
          for (int64_t d = 0; d < m.nope; ++d) keys_t[d * kKeyBlock + j] = k_nope[d];
          for (int64_t d = 0; d < m.r; ++d) keys_t[(m.nope + d) * kKeyBlock + j] = k_pe[d];
        }
        // Query blocks whose last query comes before k0 see none of these keys.
        const int64_t first_block =
            q0 + std::max<int64_t>(0, (k0 - start - q0) / kQueryBlock) * kQueryBlock;
        for (int64_t b0 = first_block; b0 < q1; b0 += kQueryBlock) {
          const int64_t nq = std::min(kQueryBlock, q1 - b0);
          Gemm(nq, nk, m.qhd, q + (b0 * m.h + head) * m.qhd, m.h * m.qhd, keys_t, kKeyBlock, scores,
               kKeyBlock, false);
          for (int64_t ii = 0; ii < nq; ++ii) {  // causal mask
            const int64_t first_masked = std::max<int64_t>(start + b0 + ii + 1 - k0, 0);
            for (int64_t j = first_masked; j < nk; ++j) {
              scores[ii * kKeyBlock + j] = -std::numeric_limits<float>::infinity();
            }
          }
          float* acc = o + b0 * o_stride + head * m.vd;
          SoftmaxBlock(scores, kKeyBlock, nq, nk, max + (b0 - q0), sum + (b0 - q0), acc, o_stride,
                       m.vd);
          Gemm(nq, m.vd, nk, scores, kKeyBlock, kv_head + k0 * kv_stride + m.nope, kv_stride, acc,
               o_stride, true);
        }
      }
      for (int64_t i = q0; i < q1; ++i)
        Scale(1.0f / sum[i - q0], o + i * o_stride + head * m.vd, m.vd);
    }
  });
}

// Absorbed form (§6.2) over the latent rows: for each query token, all heads read a block of
// cache rows together (scores by dot products, values by one GEMM), so a decode step streams the
// cache once rather than once per head. When there are few query tokens, each one's keys are
// split across threads and the partial softmaxes merged at the end.
constexpr int64_t kLatentKeyBlock = 64;
constexpr int64_t kMinKeysPerSplit = 128;

// Key splits per query token that sees `keys` cached tokens, in a call whose absorbed query tokens
// see `total_keys` keys in all: items of about total / (2 x threads) keys (at least
// kMinKeysPerSplit), so that one long query among short ones (a prompt chunk at position 30k
// beside decode steps) is spread over the threads instead of running on one.
// Batch invariant (base/batch_invariance.h): splits of this many keys at fixed positions, so that
// a query's partial softmaxes, and the order they merge in, depend on its own key count alone.
constexpr int64_t kInvariantKeysPerSplit = 256;

int64_t KeySplits(int64_t total_keys, int64_t keys) {
  if (BatchInvariant()) {
    return std::max<int64_t>(1, (keys + kInvariantKeysPerSplit - 1) / kInvariantKeysPerSplit);
  }
  const int64_t threads = KernelThreadCount();
  const int64_t per_item = std::max(kMinKeysPerSplit, total_keys / (2 * threads));
  return std::max<int64_t>(1, (keys + per_item - 1) / per_item);
}

int64_t PartialFloats(const MlaDims& m) { return m.h * (m.c + 2 + kLatentKeyBlock); }

// The absorbed sequences of a call. Arrays are indexed by segment; segments in the expanded form
// have no items.
struct AbsorbedWork {
  absl::Span<const MlaSegment> segments;
  const int64_t* start;       // cached tokens before this call
  const int64_t* packed_row;  // first row in the packed [A, ...] arrays
  const int64_t* first_item;  // [segments + 1] prefix sums of tokens x splits
  int64_t* keys_before;       // [first_item[segments] + 1] room for the items' running key counts
};

// The softmax partials of each (token, head)'s key splits merged into one normalized latent
// output: each split's sum and accumulator rescaled to the largest of the splits' maxima.
void MergeKeySplits(const MlaDims& m, const AbsorbedWork& work, const float* partial,
                    float* latent) {
  const int64_t count = static_cast<int64_t>(work.segments.size());
  const int64_t per_item = PartialFloats(m);
  const int64_t packed_rows = work.packed_row[count];
  ParallelFor(packed_rows * m.h, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t row = pair / m.h, head = pair % m.h;
      const int64_t s =
          std::upper_bound(work.packed_row, work.packed_row + count + 1, row) - work.packed_row - 1;
      const int64_t i = row - work.packed_row[s];
      const int64_t splits =
          (work.first_item[s + 1] - work.first_item[s]) / work.segments[s].tokens;
      const float* first = partial + (work.first_item[s] + i * splits) * per_item;
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t k = 0; k < splits; ++k) {
        best = std::max(best, first[k * per_item + m.h * m.c + head]);
      }
      float* out = latent + pair * m.c;
      std::fill_n(out, m.c, 0.0f);
      float total = 0.0f;
      for (int64_t k = 0; k < splits; ++k) {
        const float* part = first + k * per_item;
        const float weight = std::exp(part[m.h * m.c + head] - best);  // 0 for an empty split
        if (weight == 0.0f) continue;
        total += weight * part[m.h * m.c + m.h + head];
        Axpy(weight, part + head * m.c, out, m.c);
      }
      Scale(1.0f / total, out, m.c);
    }
  });
}

// q_abs: [A, H, width] pre-scaled; latent: [A, H, c]; partial: first_item[S] x PartialFloats.
void AbsorbedAttention(const MlaDims& m, const AbsorbedWork& work, const float* q_abs,
                       float* partial, float* latent) {
  const int64_t count = static_cast<int64_t>(work.segments.size());
  const int64_t items = work.first_item[count];
  const int64_t per_item = PartialFloats(m);
  // Item -> its segment s, query token i and key range: the split-th of `splits` equal runs of the
  // keys that token sees. Items differ in length (a prompt chunk at position 30k beside decode
  // steps at 300), so the threads take runs of items of about equal key counts rather than
  // equal item counts.
  auto key_range = [&](int64_t item, int64_t* s, int64_t* i, int64_t* k_begin, int64_t* k_end) {
    *s = std::upper_bound(work.first_item, work.first_item + count + 1, item) - work.first_item - 1;
    const int64_t splits =
        (work.first_item[*s + 1] - work.first_item[*s]) / work.segments[*s].tokens;
    *i = (item - work.first_item[*s]) / splits;
    const int64_t split = (item - work.first_item[*s]) % splits;
    const int64_t keys = work.start[*s] + *i + 1;
    // Batch invariant: the segment's splits are fixed runs of keys; a query's last ones may be
    // empty (they weigh nothing in the merge).
    const int64_t per_split =
        BatchInvariant() ? kInvariantKeysPerSplit : (keys + splits - 1) / splits;
    *k_begin = std::min(keys, split * per_split);
    *k_end = std::min(keys, *k_begin + per_split);
  };
  int64_t* keys_before = work.keys_before;
  keys_before[0] = 0;
  for (int64_t item = 0; item < items; ++item) {
    int64_t s, i, k_begin, k_end;
    key_range(item, &s, &i, &k_begin, &k_end);
    keys_before[item + 1] = keys_before[item] + (k_end - k_begin) + 1;  // + 1: per-item cost
  }
  const int64_t parts = std::min<int64_t>(items, KernelThreadCount());
  // Part p: the items whose first key (in the running count) lies in [p, p + 1) x total / parts.
  auto first_item_of = [&](int64_t p) {
    const int64_t from = (keys_before[items] * p + parts - 1) / parts;
    return std::lower_bound(keys_before, keys_before + items, from) - keys_before;
  };
  ParallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t item = first_item_of(p0); item < first_item_of(p1); ++item) {
      int64_t s, i, k_begin, k_end;
      key_range(item, &s, &i, &k_begin, &k_end);
      const float* rows = work.segments[s].state->rows.data();
      float* acc = partial + item * per_item;  // [H, c]
      float* max = acc + m.h * m.c;            // [H]
      float* sum = max + m.h;                  // [H]
      float* scores = sum + m.h;               // [H, kLatentKeyBlock]
      std::fill_n(acc, m.h * m.c, 0.0f);
      std::fill_n(max, m.h, -std::numeric_limits<float>::infinity());
      std::fill_n(sum, m.h, 0.0f);
      const float* qi = q_abs + (work.packed_row[s] + i) * m.h * m.width;
      for (int64_t k0 = k_begin; k0 < k_end; k0 += kLatentKeyBlock) {
        const int64_t nk = std::min(kLatentKeyBlock, k_end - k0);
        DotRows(qi, m.width, m.h, rows + k0 * m.width, m.width, nk, m.width, scores,
                kLatentKeyBlock);
        SoftmaxBlock(scores, kLatentKeyBlock, m.h, nk, max, sum, acc, m.c, m.c);
        Gemm(m.h, m.c, nk, scores, kLatentKeyBlock, rows + k0 * m.width, m.width, acc, m.c, true);
      }
    }
  });
  MergeKeySplits(m, work, partial, latent);
}

// kAuto expands a fresh prompt, and a chunk long enough that expanding the cache once (c x
// H x (nope + v) FMAs per cached token) costs less than the absorbed form's extra work per
// query and cached token (H x ((c + r + c) - (nope + r + v)) FMAs): chunks of a long prompt
// past the first one.
bool UsesExpandedForm(const MlaDims& m, MlaForm form, int64_t start, int64_t tokens) {
  const int64_t absorbed_extra = (m.width + m.c) - (m.qhd + m.vd);
  // Batch invariant: one form for every token, the one decode needs (a prompt's tokens then get
  // the same bits however the prompt was cut, and whatever the prefix cache held).
  if (form == MlaForm::kAuto && BatchInvariant()) return false;
  return tokens > 0 &&
         (form == MlaForm::kExpanded ||
          (form == MlaForm::kAuto && ((start == 0 && tokens > 1) ||
                                      (absorbed_extra > 0 &&
                                       tokens * absorbed_extra > m.c * (m.nope + m.vd)))));
}

// Where each segment's rows lie and which form it takes. The arrays, indexed by segment, live in
// the scratch's integer slots, so that a decode step allocates nothing.
struct MlaBatchPlan {
  int64_t* first_row;   // first row of x and out
  int64_t* start;       // cached tokens before the call
  int64_t* expanded;    // 1: the expanded form, 0: the absorbed form
  int64_t* packed_row;  // [segments + 1] first row among the absorbed segments' packed rows
  int64_t* first_item;  // [segments + 1] first absorbed work item (tokens x key splits)
  int64_t absorbed_rows = 0;
};

// Reads each cache's length before anything is appended: `start` is what the new tokens follow.
MlaBatchPlan PlanBatch(const MlaDims& m, absl::Span<const MlaSegment> segments, MlaForm form,
                       Scratch* scratch) {
  const int64_t count = static_cast<int64_t>(segments.size());
  MlaBatchPlan plan;
  plan.first_row = scratch->GetInts(kIntsFirstRow, count);
  plan.start = scratch->GetInts(kIntsStart, count);
  plan.expanded = scratch->GetInts(kIntsExpanded, count);
  plan.packed_row = scratch->GetInts(kIntsPackedRow, count + 1);
  plan.first_item = scratch->GetInts(kIntsFirstItem, count + 1);
  int64_t absorbed_keys = 0;  // keys over all absorbed query tokens (the last of each counted)
  for (int64_t s = 0, row = 0; s < count; ++s) {
    const int64_t tokens = segments[s].tokens;
    plan.first_row[s] = row;
    plan.start[s] = segments[s].state->length;
    row += tokens;
    plan.expanded[s] = UsesExpandedForm(m, form, plan.start[s], tokens) ? 1 : 0;
    if (!plan.expanded[s]) {
      plan.absorbed_rows += tokens;
      absorbed_keys += tokens * (plan.start[s] + tokens);
    }
  }
  // Key splits depend on the keys of all absorbed tokens, hence a second pass.
  plan.packed_row[0] = plan.first_item[0] = 0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t tokens = plan.expanded[s] ? 0 : segments[s].tokens;
    plan.packed_row[s + 1] = plan.packed_row[s] + tokens;
    plan.first_item[s + 1] = plan.first_item[s] +
                             tokens * KeySplits(absorbed_keys, plan.start[s] + segments[s].tokens);
  }
  return plan;
}

// The projections of x for all rows (scratch slots): q [T, H * qhd] pre-scaled by
// 1/sqrt(q_head_dim), ckv [T, c + r] the new cache rows after kv_a_layernorm, and gate [T, H * v]
// the output gate's logits (null when the config has no gate).
struct MlaProjections {
  float* q;
  float* ckv;
  float* gate;
};

MlaProjections Project(const ModelConfig& config, const MlaDims& m, const MlaWeights& weights,
                       const float* x, int64_t rows, Scratch* scratch) {
  MlaProjections p;
  p.q = scratch->Get(kSlotQ, rows * m.h * m.qhd);
  p.ckv = scratch->Get(kSlotCkv, rows * m.width);
  p.gate = config.mla_use_output_gate ? scratch->Get(kSlotGate, rows * m.h * m.vd) : nullptr;
  // The projections of x as one pool job (see MatMulBatch).
  MatMulTask projections[3];
  int projection_count = 0;
  auto project = [&](const WeightMatrix& w, float* y) {
    projections[projection_count++] = MatMulTask{&w, x, w.cols, y, w.rows, false};
  };
  float* q_latent = nullptr;
  if (config.q_lora_rank.has_value()) {
    q_latent = scratch->Get(kSlotQLatent, rows * *config.q_lora_rank);
    project(weights.q_a_proj, q_latent);
  } else {
    project(weights.q_proj, p.q);
  }
  project(weights.kv_a_proj_with_mqa, p.ckv);
  if (p.gate != nullptr) project(weights.g_proj, p.gate);
  MatMulBatch(projections, projection_count, rows);
  if (q_latent != nullptr) {
    const int64_t ql = *config.q_lora_rank;
    RmsNormRows(q_latent, ql, rows, ql, weights.q_a_layernorm.data(), kMlaLatentNormEps, q_latent,
                ql);
    MatMul(weights.q_b_proj, q_latent, rows, p.q);
  }
  Scale(1.0f / std::sqrt(static_cast<float>(m.qhd)), p.q, rows * m.h * m.qhd);
  RmsNormRows(p.ckv, m.width, rows, m.c, weights.kv_a_layernorm.data(), kMlaLatentNormEps, p.ckv,
              m.width);
  return p;
}

// Appends the new [c | k_pe] rows to each cache, growing it geometrically so that decode
// reallocates only now and then.
void AppendToCaches(const MlaDims& m, const MlaBatchPlan& plan,
                    absl::Span<const MlaSegment> segments, const float* ckv) {
  for (size_t s = 0; s < segments.size(); ++s) {
    MlaCache* cache = segments[s].state;
    const int64_t total = plan.start[s] + segments[s].tokens;
    if (cache->rows.size() < static_cast<size_t>(total * m.width)) {
      cache->Reserve(
          std::max<int64_t>(total, 2 * static_cast<int64_t>(cache->rows.size()) / m.width));
    }
    std::copy_n(ckv + plan.first_row[s] * m.width, segments[s].tokens * m.width,
                cache->rows.data() + plan.start[s] * m.width);
    cache->length = total;
  }
}

// The expanded form (§6.1) for the segments that take it, after their new rows joined the cache:
// K/V for every cached token of the sequence, [N, H, nope + v], then attention into o.
void RunExpandedSegments(const MlaDims& m, const MlaWeights& weights, const MlaBatchPlan& plan,
                         absl::Span<const MlaSegment> segments, const float* q, float* o,
                         Scratch* scratch) {
  for (size_t s = 0; s < segments.size(); ++s) {
    if (!plan.expanded[s]) continue;
    const MlaCache& cache = *segments[s].state;
    float* kv = scratch->Get(kSlotKv, cache.length * m.h * m.kv_width);
    MatMul(weights.kv_b_proj, cache.rows.data(), m.width, cache.length, kv, m.h * m.kv_width);
    ExpandedAttention(m, q + plan.first_row[s] * m.h * m.qhd, kv, cache.rows.data(),
                      plan.start[s], segments[s].tokens, o + plan.first_row[s] * m.h * m.vd);
  }
}

// The absorbed form (§6.2) on the packed rows of the segments that take it: q̃_h = W_K[h]ᵀ q_nope_h
// next to q_pe_h, scored against whole cache rows; then O_h = W_V[h] õ_h, unpacked into o.
// Packing lets kv_b_proj's halves multiply all absorbed rows at once.
void RunAbsorbedSegments(const MlaDims& m, const MlaWeights& weights, const MlaBatchPlan& plan,
                         absl::Span<const MlaSegment> segments, const float* q, float* o,
                         Scratch* scratch) {
  const int64_t count = static_cast<int64_t>(segments.size());
  const int64_t h = m.h, qhd = m.qhd, vd = m.vd, width = m.width, c = m.c;
  const int64_t absorbed_rows = plan.absorbed_rows;
  float* packed = scratch->Get(kSlotPacked, absorbed_rows * h * std::max(qhd, vd));
  float* q_abs = scratch->Get(kSlotQAbs, absorbed_rows * h * width);
  float* latent = scratch->Get(kSlotLatent, absorbed_rows * h * c);
  float* partial = scratch->Get(kSlotPartial, plan.first_item[count] * PartialFloats(m));
  for (int64_t s = 0; s < count; ++s) {
    if (plan.expanded[s]) continue;
    std::copy_n(q + plan.first_row[s] * h * qhd, segments[s].tokens * h * qhd,
                packed + plan.packed_row[s] * h * qhd);
  }
  ParallelFor(h, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t head = h0; head < h1; ++head) {
      MatMulTransposed(weights.kv_b_proj.RowSlice(head * m.kv_width, m.nope), packed + head * qhd,
                       h * qhd, absorbed_rows, q_abs + head * width, h * width);
      for (int64_t i = 0; i < absorbed_rows; ++i) {
        std::copy_n(packed + (i * h + head) * qhd + m.nope, m.r,
                    q_abs + (i * h + head) * width + c);
      }
    }
  });
  int64_t* keys_before = scratch->GetInts(kIntsKeysBefore, plan.first_item[count] + 1);
  AbsorbedAttention(
      m, AbsorbedWork{segments, plan.start, plan.packed_row, plan.first_item, keys_before}, q_abs,
      partial, latent);
  ParallelFor(h, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t head = h0; head < h1; ++head) {
      MatMul(weights.kv_b_proj.RowSlice(head * m.kv_width + m.nope, vd), latent + head * c, h * c,
             absorbed_rows, packed + head * vd, h * vd);
    }
  });
  for (int64_t s = 0; s < count; ++s) {
    if (plan.expanded[s]) continue;
    std::copy_n(packed + plan.packed_row[s] * h * vd, segments[s].tokens * h * vd,
                o + plan.first_row[s] * h * vd);
  }
}

}  // namespace

void MlaCache::Reserve(int64_t tokens) {
  const size_t needed = static_cast<size_t>(tokens * width());
  if (rows.size() < needed) rows.resize(needed);
}

absl::Status MlaForwardBatch(const ModelConfig& config, const MlaWeights& weights, const float* x,
                             absl::Span<const MlaSegment> segments, float* out, Scratch* scratch,
                             MlaForm form) {
  const MlaDims dims = DimsOf(config);
  K3_ASSIGN_OR_RETURN(const int64_t rows,
                      CheckSegments("MLA", "cache", segments, [&](const MlaCache& cache) {
                        return Validate(config, dims, weights, cache);
                      }));
  if (rows == 0) return absl::OkStatus();

  const MlaBatchPlan plan = PlanBatch(dims, segments, form, scratch);
  const MlaProjections projected = Project(config, dims, weights, x, rows, scratch);
  AppendToCaches(dims, plan, segments, projected.ckv);
  float* o = scratch->Get(kSlotO, rows * dims.h * dims.vd);
  RunExpandedSegments(dims, weights, plan, segments, projected.q, o, scratch);
  if (plan.absorbed_rows > 0) {
    RunAbsorbedSegments(dims, weights, plan, segments, projected.q, o, scratch);
  }
  if (projected.gate != nullptr) MulSigmoid(projected.gate, o, rows * dims.h * dims.vd);
  MatMul(weights.o_proj, o, rows, out);
  return absl::OkStatus();
}

}  // namespace k3
