// Token routing of a MoE layer (spec §7.2): sigmoid scores s = σ(W_gate x), selection by top-k of
// s + e_score_correction_bias (the bias picks experts but never weights them), weights renormalized
// over the chosen set and multiplied by routed_scaling_factor. Ties go to the lower expert id.
#ifndef K3SERVE_ROUTER_GATE_H_
#define K3SERVE_ROUTER_GATE_H_

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace k3 {

struct Routing {
  int64_t tokens = 0;
  int top_k = 0, num_experts = 0;
  std::vector<int32_t> experts;  // [tokens, top_k], in descending order of s + bias
  std::vector<float> weights;    // [tokens, top_k], matching `experts`
  std::vector<float> scores;     // [tokens, num_experts] sigmoid scores (QB statistics read them)
};

// Routes `tokens` rows of x ([tokens, d], the post_attention_layernorm output).
void RouteTokens(const RouterWeights& weights, const ModelConfig& config, const float* x,
                 int64_t tokens, Routing* routing);

// Top-k selection and weights for one token from its scores; exposed for tests and the QB tools.
// `bias` may be null. Writes k ids and weights.
void SelectExperts(const float* scores, const float* bias, int num_experts, int top_k,
                   bool renormalize, float scaling, int32_t* ids, float* weights);

// The weights SelectExperts gives top_k chosen `ids` (in range, distinct) from the token's
// scores: each id's score, over their sum when renormalizing (top_k > 1), times `scaling`.
void WeighExperts(const float* scores, const int32_t* ids, int top_k, bool renormalize,
                  float scaling, float* weights);

}  // namespace k3

#endif  // K3SERVE_ROUTER_GATE_H_
