// The KDA (Kimi Delta Attention) sequence mixer of spec §5, fp32 on the CPU.
//
// KdaForwardBatch runs one KDA layer over new tokens of one or more sequences: projections (once
// over all rows), causal short convolutions + SiLU (continuing each sequence's conv caches), the
// per-channel decay gate (§5.3 option A with a lower bound, or option B softplus), L2-normalized
// q/k, the sigmoid beta, the gated delta rule on each sequence's per-head state S [K, V], the gated
// per-head RMSNorm and o_proj.
//
// Two algorithms compute the same recurrence: the token-by-token recurrence (decode) and a chunked
// form (prefill) that handles kKdaChunk tokens at a time with a triangular solve (the WY form of
// fla's naive_chunk_kda), touching the state once per chunk instead of once per token and doing
// its work as small GEMMs.
//
// Thread-safety: a KdaState belongs to one sequence; calls that share a state or a Scratch must be
// serialized. Weights are read-only. Work is split across the kernel thread pool.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_KDA_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_KDA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "attention_nodes/forward/layer_math.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3 {

// The decode cache of one KDA layer for one sequence (spec §5.6).
struct KdaState {
  KdaState() = default;
  // A zero state sized for `config` (its linear_attn part).
  explicit KdaState(const ModelConfig& config);

  // Back to the start of a sequence: zero conv caches and state, sizes kept.
  void Reset();
  // Bytes held by the caches and the state.
  size_t ByteSize() const;

  int num_heads = 0;
  int head_dim = 0;     // K = V
  int conv_window = 0;  // short_conv_kernel_size - 1: the past inputs a conv needs

  // The last `conv_window` PRE-conv projected inputs, oldest first: [conv_window, H * head_dim].
  std::vector<float> conv_q, conv_k, conv_v;
  // Per head S_h [K, V] (key-row major): [H, K, V].
  std::vector<float> s;
};

enum class KdaAlgorithm {
  kAuto,       // recurrence for one token, chunked otherwise
  kRecurrent,  // token-by-token recurrence for any T
  kChunked,    // chunks of kKdaChunk tokens for any T
};

// fla uses 64 (a GPU tile); on the CPU the pairwise in-chunk work grows with the chunk while the
// state traffic it saves stops mattering past ~16, which measured fastest (about 2x the recurrence
// at head_dim 128; 8 and 16 tie, 32 and 64 are slower).
inline constexpr int kKdaChunk = 16;

// One sequence's share of a batched call (KdaForwardBatch, layer_math.h), continuing its `state`.
using KdaSegment = MixerSegment<KdaState>;

// Runs one KDA layer over new tokens of one or more sequences. x: [rows, hidden_size], the
// input_layernorm output, rows = Σ tokens. out: [rows, hidden_size], the mixer output after
// o_proj. Every projection runs once over all rows (so a decode batch reads each weight once);
// the convs and the delta rule run per sequence, advancing each state past its new tokens.
// `scratch` holds the temporaries (reused across calls; nothing is allocated once it has grown).
// kAuto picks the recurrence for one-token segments and the chunked form otherwise.
// Returns InvalidArgument when a state or the weights do not match `config`; then nothing is
// written and no state changes. REQUIRES: out does not overlap x; the states are distinct.
// One sequence: segments {{&state, tokens}}, x and out [tokens, hidden_size].
absl::Status KdaForwardBatch(const ModelConfig& config, const KdaWeights& weights, const float* x,
                             absl::Span<const KdaSegment> segments, float* out, Scratch* scratch,
                             KdaAlgorithm algorithm = KdaAlgorithm::kAuto);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_KDA_H_
