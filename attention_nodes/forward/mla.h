// The MLA (multi-head latent attention) sequence mixer of spec §6, fp32 on the CPU: NoPE (no
// rotation anywhere; the 64-d "rope" slice is a shared key bypass), q-LoRA or a plain q_proj, and
// an optional sigmoid output gate (K3 has one, Kimi Linear has none).
//
// Two forms compute the same attention. The expanded form (§6.1) materializes per-head keys and
// values from the latent cache with kv_b_proj; it is cheaper per key and used for prefill. The
// absorbed form (§6.2) folds kv_b_proj's key half into the query and its value half after the
// softmax, so it reads only the 576-wide cache rows; it is used for decode.
//
// Thread-safety: an MlaCache belongs to one sequence; calls that share a cache or a Scratch must be
// serialized. Weights are read-only. Work is split across the kernel thread pool.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_MLA_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_MLA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/layer_math.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3 {

// The latent cache of one MLA layer for one sequence: per token, c (after kv_a_layernorm,
// kv_lora_rank values) followed by k_pe (qk_rope_head_dim values).
struct MlaCache {
  MlaCache() = default;
  // An empty cache for `config`'s MLA dims.
  explicit MlaCache(const ModelConfig& config)
      : kv_lora_rank(config.kv_lora_rank), rope_dim(config.qk_rope_head_dim) {}

  int64_t width() const { return kv_lora_rank + rope_dim; }
  const float* Row(int64_t token) const { return rows.data() + token * width(); }
  // Makes room for `tokens` in total without reallocating later.
  void Reserve(int64_t tokens);
  // Back to an empty sequence; capacity kept.
  void Clear() { length = 0; }
  // Bytes held (capacity, not just the filled rows).
  size_t ByteSize() const { return rows.capacity() * sizeof(float); }

  int kv_lora_rank = 0;
  int rope_dim = 0;
  int64_t length = 0;       // tokens cached
  std::vector<float> rows;  // [>= length, width()]; rows past `length` are unused
};

// One sequence's share of a batched call (MlaForwardBatch, layer_math.h): its new tokens attend to
// and are appended to its cache, `state`.
using MlaSegment = MixerSegment<MlaCache>;

enum class MlaForm {
  kAuto,      // expanded when the cache is empty and tokens > 1, or for chunks long enough
              // that expanding the cache pays (see mla.cc); absorbed otherwise
  kExpanded,  // expands every cached token through kv_b_proj (cost grows with the whole context)
  kAbsorbed,
};

// Latent norms (q_a_layernorm, kv_a_layernorm) use the class default ε, not rms_norm_eps (§3.1).
inline constexpr float kMlaLatentNormEps = 1e-6f;

// Runs one MLA layer over new tokens of several sequences at once; each sequence's new tokens
// attend causally to its cached tokens and to each other. x: [rows, hidden_size], the
// input_layernorm output, rows = Σ tokens. out: [rows, hidden_size], after o_proj. The projections
// run once over all rows (a decode batch reads each weight once); attention runs per sequence.
// The new tokens' latent rows are appended to each cache. `scratch` holds the temporaries. The form
// is chosen per sequence. Returns InvalidArgument when a cache or the weights do not match
// `config`; then nothing is written and no cache changes. REQUIRES: out does not overlap x; the
// caches are distinct. One sequence: segments {{&cache, tokens}}, x and out [tokens, hidden_size].
absl::Status MlaForwardBatch(const ModelConfig& config, const MlaWeights& weights, const float* x,
                             absl::Span<const MlaSegment> segments, float* out, Scratch* scratch,
                             MlaForm form = MlaForm::kAuto);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_MLA_H_
