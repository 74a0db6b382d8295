// Scalar activations shared by the attention mixers, the router and the gated MLPs (fp32).
#ifndef K3SERVE_KERNELS_ACTIVATION_H_
#define K3SERVE_KERNELS_ACTIVATION_H_

#include <cmath>

namespace k3 {

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// log(1 + e^x), with torch's linear cut-over above 20 (the difference there is below 2e-9).
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace k3

#endif  // K3SERVE_KERNELS_ACTIVATION_H_
