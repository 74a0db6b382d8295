// The gated-MLP activation a config asks for (spec §3.2; Kimi Linear: SwiGLU).
#ifndef K3SERVE_MODEL_GLU_PARAMS_H_
#define K3SERVE_MODEL_GLU_PARAMS_H_

#include "kernels/gated_mlp.h"
#include "model/config.h"

namespace k3 {

inline GluParams GluParamsFor(const ModelConfig& config) {
  GluParams params;
  params.situ = config.hidden_act == Activation::kSitu;
  params.beta = config.activation_situ_beta;
  params.linear_beta = params.situ ? config.activation_situ_linear_beta.value_or(0.f) : 0.f;
  return params;
}

}  // namespace k3

#endif  // K3SERVE_MODEL_GLU_PARAMS_H_
