// Gated MLPs: y = W_down (act(W_gate x) ⊙ cap(W_up x)), the FFN of the dense layer, the shared
// experts and every routed expert (spec §3.2, §7).
//
// K3 uses SiTU-GLU: act(a) = β·tanh(a/β)·σ(a) and cap(b) = λ·tanh(b/λ) (β = 4, λ = 25); Kimi Linear
// uses SwiGLU: act(a) = SiLU(a), cap(b) = b. All math in fp32.
#ifndef K3SERVE_KERNELS_GATED_MLP_H_
#define K3SERVE_KERNELS_GATED_MLP_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/activation.h"
#include "kernels/glu_params.h"
#include "kernels/matmul.h"

namespace k3 {

// act(a) ⊙ cap(b) for one element.
inline float GluCombine(const GluParams& p, float a, float b) {
  float capped = p.linear_beta > 0.f ? p.linear_beta * std::tanh(b / p.linear_beta) : b;
  float activated = p.situ ? p.beta * std::tanh(a / p.beta) * Sigmoid(a) : a * Sigmoid(a);
  return activated * capped;
}

// gate[i] = GluCombine(p, gate[i], up[i]) for i in [0, n), in 16-lane vectors: e^x to about 2 ulp
// (simd::Exp) and tanh from it (a short series near 0, where 1 - 2/(e^2x + 1) would cancel). Agrees
// with the scalar GluCombine to a few ulp of the result's magnitude.
void GluCombineRow(const GluParams& p, float* gate, const float* up, int64_t n);

struct GatedMlpMatrices {
  WeightMatrix gate;  // [f, d]
  WeightMatrix up;    // [f, d]
  WeightMatrix down;  // [d_out, f]
};

// y[t] (+)= MLP(x[t]) for `tokens` rows; x: [tokens, d] dense, y: [tokens, d_out] dense.
// `scratch` is resized as needed and may be reused across calls to avoid allocation.
void GatedMlp(const GatedMlpMatrices& w, const GluParams& params, const float* x, int64_t tokens,
              float* y, bool accumulate, std::vector<float>* scratch);

}  // namespace k3

#endif  // K3SERVE_KERNELS_GATED_MLP_H_
