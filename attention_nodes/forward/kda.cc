#include "attention_nodes/forward/kda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/fp32_products.h"
#include "kernels/rms_norm.h"
#include "kernels/simd.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

using simd::kWidth;
using simd::Load;
using simd::Store;
using simd::Vec16;

enum Slot {
  kSlotQ,
  kSlotK,
  kSlotV,
  kSlotDecay,        // f, then the log-space gate g [T, P]
  kSlotBeta,         // [T, H]
  kSlotGate,         // output gate logits [T, P]
  kSlotLowRank,      // the decay's low-rank intermediate [T, rank]
  kSlotGateLowRank,  // the output gate's low-rank intermediate [T, rank]
  kSlotOut,          // o, then the gated norm of o [T, P]
  kSlotConvTail,     // the new conv caches [conv_window, P]
  kSlotConvWeights,  // one conv weight transposed to [kernel, P]
  kSlotHeads,        // per-head work areas
};

absl::Status CheckMatrix(const WeightMatrix& m, int64_t rows, int64_t cols, const char* name) {
  return CheckWeightMatrix("KDA", m, rows, cols, name);
}

absl::Status CheckVector(const std::vector<float>& v, size_t size, const char* name) {
  return CheckWeightVector("KDA", v, size, name);
}

absl::Status Validate(const ModelConfig& config, const KdaWeights& w, const KdaState& state) {
  const LinearAttnConfig& la = config.linear_attn;
  const int64_t h = la.num_heads, k = la.head_dim, p = h * k, d = config.hidden_size;
  const int kernel = la.short_conv_kernel_size;
  if (kernel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KDA short_conv_kernel_size ", kernel, " is below 1"));
  }
  if (state.num_heads != h || state.head_dim != k || state.conv_window != kernel - 1 ||
      state.s.size() != static_cast<size_t>(h * k * k) ||
      state.conv_q.size() != static_cast<size_t>((kernel - 1) * p) ||
      state.conv_k.size() != state.conv_q.size() || state.conv_v.size() != state.conv_q.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KDA state is sized for ", state.num_heads, " heads x ", state.head_dim, " (conv window ",
        state.conv_window, "), the config needs ", h, " x ", k, " (conv window ", kernel - 1, ")"));
  }
  K3_RETURN_IF_ERROR(CheckMatrix(w.q_proj, p, d, "q_proj"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.k_proj, p, d, "k_proj"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.v_proj, p, d, "v_proj"));
  K3_RETURN_IF_ERROR(CheckVector(w.q_conv, p * kernel, "q_conv1d"));
  K3_RETURN_IF_ERROR(CheckVector(w.k_conv, p * kernel, "k_conv1d"));
  K3_RETURN_IF_ERROR(CheckVector(w.v_conv, p * kernel, "v_conv1d"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.f_a_proj, -1, d, "f_a_proj"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.f_b_proj, p, w.f_a_proj.rows, "f_b_proj"));
  K3_RETURN_IF_ERROR(CheckVector(w.dt_bias, p, "dt_bias"));
  K3_RETURN_IF_ERROR(CheckVector(w.a_log, h, "A_log"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.b_proj, h, d, "b_proj"));
  if (la.use_full_rank_gate) {
    K3_RETURN_IF_ERROR(CheckMatrix(w.g_proj, p, d, "g_proj"));
  } else {
    K3_RETURN_IF_ERROR(CheckMatrix(w.g_a_proj, -1, d, "g_a_proj"));
    K3_RETURN_IF_ERROR(CheckMatrix(w.g_b_proj, p, w.g_a_proj.rows, "g_b_proj"));
  }
  K3_RETURN_IF_ERROR(CheckVector(w.o_norm, k, "o_norm"));
  K3_RETURN_IF_ERROR(CheckMatrix(w.o_proj, d, p, "o_proj"));
  return absl::OkStatus();
}

// Causal depthwise conv + SiLU over channels [c0, c1) of x [T, P] in place (spec §3.4),
// continuing from `cache` (the last `window` pre-conv inputs, oldest first) and leaving there the
// last `window` inputs of [cache; x]. Runs backwards in time so that every input is read before it
// is overwritten. `weight_t` is the weight transposed to [kernel, P] so that channels are
// contiguous; `tail` has room for [window, P] (only channels [c0, c1) are used).
void ConvSiluChannels(float* x, int64_t tokens, int64_t p, int64_t c0, int64_t c1,
                      const float* weight_t, int kernel, float* cache, float* tail) {
  if (tokens == 0) return;
  const int64_t window = kernel - 1;
  const int64_t width = c1 - c0;
  auto input_row = [&](int64_t j) {  // j in [-window, tokens)
    return j >= 0 ? x + j * p : cache + (window + j) * p;
  };
  for (int64_t r = 0; r < window; ++r) {
    std::memcpy(tail + r * p + c0, input_row(tokens - window + r) + c0, width * sizeof(float));
  }
  constexpr int64_t kBlock = 512;
  float acc[kBlock];
  for (int64_t t = tokens - 1; t >= 0; --t) {
    // The current token's row is read last (tap kernel - 1), so the result may overwrite it.
    for (int64_t done = 0; done < width; done += kBlock) {
      const int64_t n = std::min(kBlock, width - done);
      std::fill_n(acc, n, 0.0f);
      for (int i = 0; i < kernel; ++i) {
        MulAdd(weight_t + i * p + c0 + done, input_row(t - window + i) + c0 + done, acc, n);
      }
      float* out = x + t * p + c0 + done;
      std::memcpy(out, acc, n * sizeof(float));
      SiluInPlace(out, n);
    }
  }
  for (int64_t r = 0; r < window; ++r) {
    std::memcpy(cache + r * p + c0, tail + r * p + c0, width * sizeof(float));
  }
}

// The per-channel log decay of §5.3 option A over n channels of one head, in place on f:
// g = lower_bound · σ(a · (f + dt_bias)).
K3_VECTOR_CLONES
void LowerBoundGate(float* f, const float* dt_bias, float a, float lower_bound, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const Vec16 z = (Load(f + i) + Load(dt_bias + i)) * a;
    Store(f + i, lower_bound / (1.0f + simd::Exp(-z)));
  }
  for (; i < n; ++i) f[i] = lower_bound * Sigmoid(a * (f[i] + dt_bias[i]));
}

// The values of x[0..] shaped as `like`: a vector's lanes or one float (the scalar tail).
K3_SIMD_INLINE Vec16 LoadLike(const float* x, Vec16) { return Load(x); }
K3_SIMD_INLINE float LoadLike(const float* x, float) { return *x; }

// One pass of a recurrence step over S [kdim, vdim], block of columns by block: every row j of S
// becomes update(old, j, v) (old: its values at columns v.., a Vec16 or, in the tail, a float),
// and out = Sᵀ read of the updated S. Forced inline, and so are the callers' `update`s: compiled
// inside each caller's clones. REQUIRES: s overlaps neither `read`, `out` nor what `update` reads
// (__restrict lets the compiler keep update's loads of a column block in registers across rows).
template <typename Update>
K3_SIMD_INLINE void UpdateAndRead(float* __restrict s, const float* read, float* out, int64_t kdim,
                                  int64_t vdim, const Update& update) {
  int64_t v0 = 0;
  for (; v0 + kWidth <= vdim; v0 += kWidth) {
    Vec16 acc{};
    for (int64_t j = 0; j < kdim; ++j) {
      float* row = s + j * vdim + v0;
      const Vec16 updated = update(Load(row), j, v0);
      Store(row, updated);
      acc += read[j] * updated;
    }
    Store(out + v0, acc);
  }
  for (; v0 < vdim; ++v0) {
    float acc = 0.0f;
    for (int64_t j = 0; j < kdim; ++j) {
      float& cell = s[j * vdim + v0];
      cell = update(cell, j, v0);
      acc += read[j] * cell;
    }
    out[v0] = acc;
  }
}

// One recurrence step, first half: S_j *= a_j for every key row j, then pred = Sᵀ k.
K3_VECTOR_CLONES
void DecayAndPredict(float* s, const float* a, const float* k, float* pred, int64_t kdim,
                     int64_t vdim) {
  const auto decay = [&](auto old, int64_t j, int64_t) __attribute__((always_inline)) {
    return old * a[j];
  };
  UpdateAndRead(s, k, pred, kdim, vdim, decay);
}

// Second half: S += k wᵀ, then o = Sᵀ q.
K3_VECTOR_CLONES
void WriteAndRead(float* s, const float* k, const float* w, const float* q, float* o, int64_t kdim,
                  int64_t vdim) {
  const auto write = [&](auto old, int64_t j, int64_t v) __attribute__((always_inline)) {
    return old + k[j] * LoadLike(w + v, old);
  };
  UpdateAndRead(s, q, o, kdim, vdim, write);
}

// ke *= a, then returns k·ke and q·ke through dk and dq.
K3_VECTOR_CLONES
void DecayDot2(float* ke, const float* a, const float* k, const float* q, int64_t n, float* dk,
               float* dq) {
  Vec16 acc_k{}, acc_q{};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const Vec16 decayed = Load(ke + i) * Load(a + i);
    Store(ke + i, decayed);
    acc_k += Load(k + i) * decayed;
    acc_q += Load(q + i) * decayed;
  }
  float sum_k = simd::Sum(acc_k), sum_q = simd::Sum(acc_q);
  for (; i < n; ++i) {
    ke[i] *= a[i];
    sum_k += k[i] * ke[i];
    sum_q += q[i] * ke[i];
  }
  *dk = sum_k;
  *dq = sum_q;
}

// Per-token inputs of the core for one head; row t of a [T, P] array starts at t * stride.
struct HeadInputs {
  const float* q;  // L2-normalized, scaled by K^{-1/2}
  const float* k;  // L2-normalized
  const float* v;
  const float* g;     // log-space decay
  const float* beta;  // stride beta_stride
  int64_t stride;
  int64_t beta_stride;
};

void RecurrentHead(const HeadInputs& in, int64_t tokens, int64_t kdim, float* s, float* o,
                   float* work) {
  float* a = work;         // [K]
  float* u = work + kdim;  // [V]
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(a, in.g + t * in.stride, kdim * sizeof(float));
    ExpInPlace(a, kdim);
    const float* k = in.k + t * in.stride;
    const float* v = in.v + t * in.stride;
    DecayAndPredict(s, a, k, u, kdim, kdim);
    const float beta = in.beta[t * in.beta_stride];
    for (int64_t j = 0; j < kdim; ++j) u[j] = beta * (v[j] - u[j]);
    WriteAndRead(s, k, u, in.q + t * in.stride, o + t * in.stride, kdim, kdim);
  }
}

int64_t ChunkedWorkFloats(int64_t kdim) {
  constexpr int64_t c = kKdaChunk;
  return 5 * c * kdim + 2 * c * c + c * kdim + kdim;
}

// The chunked form. Within a chunk, with G_t the inclusive cumulative log decay from the chunk
// start, S0 the state before the chunk and W_s = β_s u_s the write of token s:
//   W_t = β_t (v_t − S0ᵀ(e^{G_t}⊙k_t)) − β_t Σ_{s<t} Akk[t,s] W_s     (forward substitution)
//   o_t = S0ᵀ(e^{G_t}⊙q_t) + Σ_{s≤t} Aqk[t,s] W_s
//   S   = diag(e^{G_last}) S0 + Σ_s (k_s ⊙ e^{G_last−G_s}) W_sᵀ
// with Akk[t,s] = Σ_j k_t,j k_s,j e^{G_t,j−G_s,j} and likewise Aqk. The pairwise decays are
// built as running products of per-step decays, so no exponent ever exceeds 0 whatever the gate.
void ChunkedHead(const HeadInputs& in, int64_t tokens, int64_t kdim, float* s, float* o,
                 float* work) {
  constexpr int64_t c = kKdaChunk;
  const int64_t vdim = kdim;
  float* a = work;               // [C, K] per-step decay e^{g}, later k_s ⊙ e^{G_last − G_s}
  float* cum = a + c * kdim;     // [C, K] G
  float* kg = cum + c * kdim;    // [C, K] e^{G_t} ⊙ k_t
  float* qg = kg + c * kdim;     // [C, K] e^{G_t} ⊙ q_t
  float* kdec = qg + c * kdim;   // [K, C] (k_s ⊙ e^{G_last − G_s}) transposed
  float* akk = kdec + c * kdim;  // [C, C], row t scaled by −β_t
  float* aqk = akk + c * c;      // [C, C], zero above the diagonal
  float* wr = aqk + c * c;       // [C, V] W
  float* ke = wr + c * vdim;     // [K]

  for (int64_t t0 = 0; t0 < tokens; t0 += c) {
    const int64_t len = std::min(c, tokens - t0);
    if (len == 1) {
      // A chunk of one token is the recurrence's step, bit for bit: a prompt whose last token
      // starts a chunk gets the same state whether that token came alone (a one-token segment
      // takes the recurrence) or at the end of a longer segment (batch invariance).
      const HeadInputs one{in.q + t0 * in.stride, in.k + t0 * in.stride, in.v + t0 * in.stride,
                           in.g + t0 * in.stride, in.beta + t0 * in.beta_stride, in.stride,
                           in.beta_stride};
      RecurrentHead(one, 1, kdim, s, o + t0 * in.stride, work);
      continue;
    }
    auto row = [&](const float* base, int64_t t) { return base + (t0 + t) * in.stride; };

    for (int64_t t = 0; t < len; ++t) {
      const float* g = row(in.g, t);
      float* cum_t = cum + t * kdim;
      if (t == 0) {
        std::memcpy(cum_t, g, kdim * sizeof(float));
      } else {
        for (int64_t j = 0; j < kdim; ++j) cum_t[j] = cum_t[j - kdim] + g[j];
      }
      std::memcpy(a + t * kdim, g, kdim * sizeof(float));
      std::memcpy(kg + t * kdim, cum_t, kdim * sizeof(float));
    }
    ExpInPlace(a, len * kdim);
    ExpInPlace(kg, len * kdim);
    for (int64_t t = 0; t < len; ++t) {
      const float* q = row(in.q, t);
      const float* k = row(in.k, t);
      for (int64_t j = 0; j < kdim; ++j) {
        qg[t * kdim + j] = q[j] * kg[t * kdim + j];
        kg[t * kdim + j] *= k[j];
      }
    }

    for (int64_t si = 0; si < len; ++si) {
      const float* ks = row(in.k, si);
      std::memcpy(ke, ks, kdim * sizeof(float));
      std::fill(aqk + si * c + si + 1, aqk + si * c + len, 0.0f);
      aqk[si * c + si] = Dot(row(in.q, si), ks, kdim);
      for (int64_t t = si + 1; t < len; ++t) {
        DecayDot2(ke, a + t * kdim, row(in.k, t), row(in.q, t), kdim, &akk[t * c + si],
                  &aqk[t * c + si]);
      }
    }

    // Inter-chunk terms: W starts as Kg S0, o as Qg S0.
    Gemm(len, vdim, kdim, kg, kdim, s, vdim, wr, vdim, /*accumulate=*/false);
    Gemm(len, vdim, kdim, qg, kdim, s, vdim, o + t0 * in.stride, in.stride, /*accumulate=*/false);

    for (int64_t t = 0; t < len; ++t) {
      const float beta = in.beta[(t0 + t) * in.beta_stride];
      const float* v = row(in.v, t);
      float* wt = wr + t * vdim;
      for (int64_t j = 0; j < vdim; ++j) wt[j] = beta * (v[j] - wt[j]);
      for (int64_t si = 0; si < t; ++si) akk[t * c + si] *= -beta;
      Gemm(1, vdim, t, akk + t * c, c, wr, vdim, wt, vdim, /*accumulate=*/true);
    }
    Gemm(len, vdim, len, aqk, c, wr, vdim, o + t0 * in.stride, in.stride, /*accumulate=*/true);

    const float* last = cum + (len - 1) * kdim;
    for (int64_t si = 0; si < len; ++si) {
      for (int64_t j = 0; j < kdim; ++j) a[si * kdim + j] = last[j] - cum[si * kdim + j];
    }
    ExpInPlace(a, len * kdim);
    for (int64_t si = 0; si < len; ++si) {
      const float* ks = row(in.k, si);
      for (int64_t j = 0; j < kdim; ++j) kdec[j * c + si] = ks[j] * a[si * kdim + j];
    }
    std::memcpy(ke, last, kdim * sizeof(float));
    ExpInPlace(ke, kdim);
    for (int64_t j = 0; j < kdim; ++j) Scale(ke[j], s + j * vdim, vdim);
    Gemm(kdim, vdim, len, kdec, c, wr, vdim, s, vdim, /*accumulate=*/true);
  }
}

// The per-row arrays of one call (scratch slots), [T, P] unless noted. The projections fill q, k, v,
// beta [T, H] and the gates' low-rank intermediates; the convs, the decay gate and the
// normalizations then work on them in place; the delta rule writes o.
struct KdaArrays {
  float* q;
  float* k;
  float* v;
  float* g;     // f, then the log-space decay
  float* beta;  // [T, H]
  float* gate;  // output gate logits
  float* o;
  float* low;       // the decay's low-rank intermediate [T, f_a_proj rows]
  float* gate_low;  // the output gate's [T, g_a_proj rows]; null with a full-rank gate
};

// Every projection of x as one pool job: in decode, one stream of weights instead of six small
// products that each end in the threads waiting for one another.
KdaArrays ProjectRows(const LinearAttnConfig& la, const KdaWeights& weights, const float* x,
                    int64_t rows, Scratch* scratch) {
  const int64_t h = la.num_heads, p = h * la.head_dim;
  KdaArrays arrays;
  arrays.q = scratch->Get(kSlotQ, rows * p);
  arrays.k = scratch->Get(kSlotK, rows * p);
  arrays.v = scratch->Get(kSlotV, rows * p);
  arrays.g = scratch->Get(kSlotDecay, rows * p);
  arrays.beta = scratch->Get(kSlotBeta, rows * h);
  arrays.gate = scratch->Get(kSlotGate, rows * p);
  arrays.o = scratch->Get(kSlotOut, rows * p);
  arrays.low = scratch->Get(kSlotLowRank, rows * weights.f_a_proj.rows);
  arrays.gate_low = la.use_full_rank_gate
                   ? nullptr
                   : scratch->Get(kSlotGateLowRank, rows * weights.g_a_proj.rows);
  MatMulTask projections[6];
  int projection_count = 0;
  auto project = [&](const WeightMatrix& w, float* y) {
    projections[projection_count++] = MatMulTask{&w, x, w.cols, y, w.rows, false};
  };
  project(weights.q_proj, arrays.q);
  project(weights.k_proj, arrays.k);
  project(weights.v_proj, arrays.v);
  project(weights.f_a_proj, arrays.low);
  project(weights.b_proj, arrays.beta);
  if (la.use_full_rank_gate) {
    project(weights.g_proj, arrays.gate);
  } else {
    project(weights.g_a_proj, arrays.gate_low);
  }
  MatMulBatch(projections, projection_count, rows);
  return arrays;
}

// The short convs (with SiLU) on q, k and v in place; each sequence continues its own conv cache.
// The weights are transposed to [kernel, P] first so the channel loops read them contiguously.
void RunShortConvs(const LinearAttnConfig& la, const KdaWeights& weights,
                   absl::Span<const KdaSegment> segments, const int64_t* first_row,
                   const KdaArrays& arrays, Scratch* scratch) {
  const int64_t p = la.num_heads * la.head_dim;
  const int kernel = la.short_conv_kernel_size;
  const int64_t count = static_cast<int64_t>(segments.size());
  float* tail = scratch->Get(kSlotConvTail, std::max<int64_t>(kernel - 1, 1) * p);
  float* conv_t = scratch->Get(kSlotConvWeights, kernel * p);
  const std::vector<float>* conv_w[3] = {&weights.q_conv, &weights.k_conv, &weights.v_conv};
  float* conv_in[3] = {arrays.q, arrays.k, arrays.v};
  for (int m = 0; m < 3; ++m) {
    for (int64_t ch = 0; ch < p; ++ch) {
      for (int i = 0; i < kernel; ++i) conv_t[i * p + ch] = (*conv_w[m])[ch * kernel + i];
    }
    ParallelFor(p, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t s = 0; s < count; ++s) {
        KdaState* state = segments[s].state;
        std::vector<float>& cache = m == 0 ? state->conv_q : m == 1 ? state->conv_k : state->conv_v;
        ConvSiluChannels(conv_in[m] + first_row[s] * p, segments[s].tokens, p, c0, c1, conv_t,
                         kernel, cache.data(), tail);
      }
    });
  }
}

// What the delta rule reads, from the projections: the decay and output gate logits up from their
// low rank, q and k L2-normalized per head (q also scaled by K^{-1/2}), β = σ(b) and the
// log-space decay g of §5.3.
void PrepareCoreInputs(const LinearAttnConfig& la, const KdaWeights& weights, int64_t rows,
                       const KdaArrays& arrays) {
  const int64_t h = la.num_heads, kdim = la.head_dim, p = h * kdim;
  MatMul(weights.f_b_proj, arrays.low, rows, arrays.g);
  if (!la.use_full_rank_gate) MatMul(weights.g_b_proj, arrays.gate_low, rows, arrays.gate);

  const float q_scale = 1.0f / std::sqrt(static_cast<float>(kdim));
  const std::optional<float> lower_bound = la.gate_lower_bound;
  ParallelFor(rows, std::max<int64_t>(1, 4096 / p), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t head = 0; head < h; ++head) {
        L2NormalizeInPlace(arrays.q + t * p + head * kdim, kdim, q_scale);
        L2NormalizeInPlace(arrays.k + t * p + head * kdim, kdim, 1.0f);
        arrays.beta[t * h + head] = Sigmoid(arrays.beta[t * h + head]);
        const float decay_rate = std::exp(weights.a_log[head]);
        float* gh = arrays.g + t * p + head * kdim;
        const float* bias = weights.dt_bias.data() + head * kdim;
        if (lower_bound.has_value()) {  // §5.3 option A
          LowerBoundGate(gh, bias, decay_rate, *lower_bound, kdim);
        } else {  // option B
          for (int64_t j = 0; j < kdim; ++j) gh[j] = -decay_rate * Softplus(gh[j] + bias[j]);
        }
      }
    }
  });
}

// The delta rule into o, advancing each state: one (sequence, head) pair per work item, in the
// chunked form or the token-by-token recurrence as `algorithm` picks per sequence.
void RunDeltaRule(const LinearAttnConfig& la, absl::Span<const KdaSegment> segments,
                  const int64_t* first_row, const KdaArrays& arrays, KdaAlgorithm algorithm,
                  Scratch* scratch) {
  const int64_t h = la.num_heads, kdim = la.head_dim, p = h * kdim;
  const int64_t count = static_cast<int64_t>(segments.size());
  auto chunked = [&](int64_t s) {
    return algorithm == KdaAlgorithm::kChunked ||
           (algorithm == KdaAlgorithm::kAuto && segments[s].tokens > 1);
  };
  int64_t work_floats = 2 * kdim;
  for (int64_t s = 0; s < count; ++s) {
    if (chunked(s)) work_floats = std::max(work_floats, ChunkedWorkFloats(kdim));
  }
  float* work = scratch->Get(kSlotHeads, count * h * work_floats);
  ParallelFor(count * h, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t s = item / h, head = item % h;
      const int64_t offset = first_row[s] * p + head * kdim;
      const HeadInputs in{arrays.q + offset, arrays.k + offset, arrays.v + offset, arrays.g + offset,
                          arrays.beta + first_row[s] * h + head, p, h};
      float* state = segments[s].state->s.data() + head * kdim * kdim;
      float* head_work = work + item * work_floats;
      if (chunked(s)) {
        ChunkedHead(in, segments[s].tokens, kdim, state, arrays.o + offset, head_work);
      } else {
        RecurrentHead(in, segments[s].tokens, kdim, state, arrays.o + offset, head_work);
      }
    }
  });
}

}  // namespace

KdaState::KdaState(const ModelConfig& config)
    : num_heads(config.linear_attn.num_heads),
      head_dim(config.linear_attn.head_dim),
      conv_window(std::max(config.linear_attn.short_conv_kernel_size - 1, 0)) {
  const size_t p = static_cast<size_t>(num_heads) * head_dim;
  conv_q.assign(conv_window * p, 0.0f);
  conv_k.assign(conv_window * p, 0.0f);
  conv_v.assign(conv_window * p, 0.0f);
  s.assign(p * head_dim, 0.0f);
}

void KdaState::Reset() {
  std::fill(conv_q.begin(), conv_q.end(), 0.0f);
  std::fill(conv_k.begin(), conv_k.end(), 0.0f);
  std::fill(conv_v.begin(), conv_v.end(), 0.0f);
  std::fill(s.begin(), s.end(), 0.0f);
}

size_t KdaState::ByteSize() const {
  return (conv_q.size() + conv_k.size() + conv_v.size() + s.size()) * sizeof(float);
}

absl::Status KdaForwardBatch(const ModelConfig& config, const KdaWeights& weights, const float* x,
                             absl::Span<const KdaSegment> segments, float* out, Scratch* scratch,
                             KdaAlgorithm algorithm) {
  K3_ASSIGN_OR_RETURN(const int64_t rows,
                      CheckSegments("KDA", "state", segments, [&](const KdaState& state) {
                        return Validate(config, weights, state);
                      }));
  if (rows == 0) return absl::OkStatus();

  const LinearAttnConfig& la = config.linear_attn;
  const int64_t count = static_cast<int64_t>(segments.size());
  int64_t* first_row = scratch->GetInts(0, count);
  for (int64_t s = 0, r = 0; s < count; ++s) {
    first_row[s] = r;
    r += segments[s].tokens;
  }
  // Projections run once over the rows of every sequence, so a batch reads each weight once; the
  // convs and the delta rule then run per sequence.
  const KdaArrays arrays = ProjectRows(la, weights, x, rows, scratch);
  RunShortConvs(la, weights, segments, first_row, arrays, scratch);
  PrepareCoreInputs(la, weights, rows, arrays);
  RunDeltaRule(la, segments, first_row, arrays, algorithm, scratch);

  // FusedRMSNormGated: per-head RMSNorm (eps rms_norm_eps, shared weight), times σ(gate).
  const int64_t kdim = la.head_dim;
  ParallelFor(rows * la.num_heads, std::max<int64_t>(1, 4096 / kdim), [&](int64_t r0, int64_t r1) {
    RmsNormRows(arrays.o + r0 * kdim, kdim, r1 - r0, kdim, weights.o_norm.data(), config.rms_norm_eps,
                arrays.o + r0 * kdim, kdim);
    MulSigmoid(arrays.gate + r0 * kdim, arrays.o + r0 * kdim, (r1 - r0) * kdim);
  });
  MatMul(weights.o_proj, arrays.o, rows, out);
  return absl::OkStatus();
}

}  // namespace k3
