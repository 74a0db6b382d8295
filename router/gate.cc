#include "router/gate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/gated_mlp.h"
#include "kernels/matmul.h"

namespace k3 {

void SelectExperts(const float* scores, const float* bias, int num_experts, int top_k,
                   bool renormalize, float scaling, int32_t* ids, float* weights) {
  thread_local std::vector<int32_t> order;
  order.resize(num_experts);
  std::iota(order.begin(), order.end(), 0);
  auto choice = [&](int32_t e) { return bias ? scores[e] + bias[e] : scores[e]; };
  // Higher choice first; equal choices keep the lower expert id first.
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
    float ca = choice(a), cb = choice(b);
    return ca > cb || (ca == cb && a < b);
  });
  std::copy(order.begin(), order.begin() + top_k, ids);
  WeighExperts(scores, ids, top_k, renormalize, scaling, weights);
}

void WeighExperts(const float* scores, const int32_t* ids, int top_k, bool renormalize,
                  float scaling, float* weights) {
  float sum = 0.f;
  for (int s = 0; s < top_k; ++s) sum += scores[ids[s]];
  for (int s = 0; s < top_k; ++s) {
    float w = scores[ids[s]];
    if (renormalize && top_k > 1) w /= sum + 1e-20f;
    weights[s] = w * scaling;
  }
}

void RouteTokens(const RouterWeights& weights, const ModelConfig& config, const float* x,
                 int64_t tokens, Routing* routing) {
  const int num_experts = config.num_experts;
  const int top_k = config.num_experts_per_token;
  routing->tokens = tokens;
  routing->top_k = top_k;
  routing->num_experts = num_experts;
  routing->scores.resize(static_cast<size_t>(tokens * num_experts));
  routing->experts.resize(static_cast<size_t>(tokens * top_k));
  routing->weights.resize(static_cast<size_t>(tokens * top_k));
  MatMul(weights.gate, x, tokens, routing->scores.data());
  const float* bias = weights.score_bias.empty() ? nullptr : weights.score_bias.data();
  for (int64_t t = 0; t < tokens; ++t) {
    float* s = routing->scores.data() + t * num_experts;
    for (int e = 0; e < num_experts; ++e) s[e] = Sigmoid(s[e]);
    SelectExperts(s, bias, num_experts, top_k, config.moe_renormalize,
                  config.routed_scaling_factor, routing->experts.data() + t * top_k,
                  routing->weights.data() + t * top_k);
  }
}

}  // namespace k3
