// A gated MLP's activation and up-branch cap (spec §3.2, kernels/gated_mlp.h): SiTU-GLU, act(a) =
// β·tanh(a/β)·σ(a) and cap(b) = λ·tanh(b/λ), or SwiGLU, act(a) = SiLU(a) and cap(b) = b. Plain
// values with no dependencies, so the GPU kernels (kernels/cuda/glu.h) take them as they are.
#ifndef K3SERVE_KERNELS_GLU_PARAMS_H_
#define K3SERVE_KERNELS_GLU_PARAMS_H_

namespace k3 {

struct GluParams {
  bool situ = true;         // false: SwiGLU
  float beta = 4.0f;        // SiTU β
  float linear_beta = 0.f;  // λ of the up-branch soft cap; 0 leaves the up branch uncapped
};

}  // namespace k3

#endif  // K3SERVE_KERNELS_GLU_PARAMS_H_
