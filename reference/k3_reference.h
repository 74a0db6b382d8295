// A plain, slow fp64 reference of the whole K3 / Kimi Linear text model (spec §4-§7), kept apart
// from the optimized engine: it reads tensors itself through Checkpoint::Find, widens every weight
// to double and runs each formula of the spec literally (KDA as the token recurrence of §5.4, MLA
// in the expanded form of §6.1). Meant for tiny configs (spec §12) as the oracle of engine tests;
// memory is one layer's weights in fp64 at a time.
//
// The per-sublayer functions take their weights as plain values so that tests can drive them with
// hand-made weights; ReferenceLogits loads them from a checkpoint, checking every shape.
//
// Thread-safety: pure functions; a Checkpoint may be shared (it is read-only).
#ifndef K3SERVE_REFERENCE_K3_REFERENCE_H_
#define K3SERVE_REFERENCE_K3_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "reference/ops.h"

namespace k3::reference {

// A gated MLP (dense layer-0 FFN, a routed expert w1/w3/w2, or the fused shared experts).
struct GluMlpParams {
  Matrix gate;  // [f, in]
  Matrix up;    // [f, in]
  Matrix down;  // [in, f]
};

// W_down (act(W_gate x) ⊙ W_up x) with the config's activation (spec §3.2).
Vec GluMlp(const GluMlpParams& p, const ModelConfig& config, const Vec& x);

// MoE layer (spec §7.2; full-width experts and no latent projections without LatentMoE).
struct MoeParams {
  Matrix router;                      // gate.weight [E, d]
  Vec score_bias;                     // e_score_correction_bias [E]
  Matrix latent_down;                 // routed_expert_down_proj [h, d]; empty without LatentMoE
  Vec latent_norm;                    // routed_expert_norm [h]; empty without the latent norm
  Matrix latent_up;                   // routed_expert_up_proj [d, h]; empty without LatentMoE
  std::vector<GluMlpParams> experts;  // [E]
  std::optional<GluMlpParams> shared;
};

// The MoE output for one normalized token x [d] (router, routed experts, latent norm, shared).
Vec MoeForward(const MoeParams& p, const ModelConfig& config, const Vec& x);

struct KdaParams {
  Matrix q_proj, k_proj, v_proj;  // [P, d]
  Matrix q_conv, k_conv, v_conv;  // [P, kernel]
  Matrix f_a_proj;                // [head_dim, d]
  Matrix f_b_proj;                // [P, head_dim]
  Vec dt_bias;                    // [P]
  Vec a_log;                      // [H]
  Matrix b_proj;                  // [H, d]
  Matrix g_proj;                  // [P, d] full-rank output gate (empty when low-rank)
  Matrix g_a_proj, g_b_proj;      // low-rank output gate [head_dim, d], [P, head_dim]
  Vec o_norm;                     // [head_dim]
  Matrix o_proj;                  // [d, P]
};

// KDA mixer over a whole sequence x [T, d] (already input_layernorm'ed), state from zero (spec §5).
Rows KdaForward(const KdaParams& p, const ModelConfig& config, const Rows& x);

struct MlaParams {
  Matrix q_a_proj;     // [q_lora, d] (empty when q_lora_rank is unset)
  Vec q_a_layernorm;   // [q_lora]
  Matrix q_b_proj;     // [H * (n + r), q_lora]
  Matrix q_proj;       // [H * (n + r), d] when q_lora_rank is unset
  Matrix kv_a_proj;    // kv_a_proj_with_mqa [c + r, d]
  Vec kv_a_layernorm;  // [c]
  Matrix kv_b_proj;    // [H * (n + v), c]
  Matrix g_proj;       // [H * v, d] (empty without the output gate)
  Matrix o_proj;       // [d, H * v]
};

// MLA mixer over x [T, d] (already input_layernorm'ed), expanded form with a causal mask (§6.1).
Rows MlaForward(const MlaParams& p, const ModelConfig& config, const Rows& x);

// One sublayer of the residual stream: layer index and its input h [T, d] (the AttnRes read, or
// the residual stream without AttnRes, before the sublayer's own RMSNorm) to its output [T, d].
using Sublayer = std::function<absl::StatusOr<Rows>(int layer, const Rows& h)>;

// An AttnRes pseudo-query: *_res_proj.weight [d] and *_res_norm.weight [d].
struct AttnResQuery {
  Vec proj;
  Vec norm;
};

struct AttnResQueries {
  std::vector<AttnResQuery> mixer;  // self_attention_res_*, one per layer
  std::vector<AttnResQuery> ffn;    // mlp_res_*, one per layer
  AttnResQuery output;              // output_attn_res_*
};

// The Block AttnRes layer flow of spec §4.2 for mixer.size() layers, from the embedding [T, d]:
// block snapshots at every layer l with l % block_size == 0 (the attention-side read of such a
// layer still sees the completed block as the partial sum), the attention-side read skipped while
// no block exists, and the mandatory output read. Returns the output read, the input of model.norm.
// Errors of the sublayers are passed through.
absl::StatusOr<Rows> AttnResStack(const Rows& embedding, int block_size,
                                  const AttnResQueries& queries, double eps, const Sublayer& mixer,
                                  const Sublayer& ffn);

// Logits of every position for a full prefill of `tokens`: [tokens.size(), vocab] row-major.
// InvalidArgument for an empty sequence, a token outside the vocabulary, or a config the spec does
// not define (mla_use_nope false, a non-sigmoid router, grouped top-k with several groups); the
// checkpoint's errors (missing tensor, wrong shape or dtype) name the tensor.
absl::StatusOr<std::vector<double>> ReferenceLogits(const Checkpoint& ckpt,
                                                    const std::vector<int32_t>& tokens);

}  // namespace k3::reference

#endif  // K3SERVE_REFERENCE_K3_REFERENCE_H_
