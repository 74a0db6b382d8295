// RMSNorm (spec §3.1): y = γ ⊙ x / sqrt(mean(x²) + ε), in fp32 (the sum in double, so long rows
// lose nothing).
#ifndef K3SERVE_KERNELS_RMS_NORM_H_
#define K3SERVE_KERNELS_RMS_NORM_H_

#include <cmath>
#include <cstdint>

namespace k3 {

// One row of `width`; `gamma` may be null (no gain). `y` may alias `x`.
inline void RmsNormRow(const float* x, const float* gamma, int64_t width, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(sum / width + eps));
  for (int64_t i = 0; i < width; ++i) y[i] = (gamma ? gamma[i] : 1.f) * (x[i] * inv);
}

// `rows` rows of `width`, densely packed.
inline void RmsNorm(const float* x, const float* gamma, int64_t rows, int64_t width, float eps,
                    float* y) {
  for (int64_t r = 0; r < rows; ++r) RmsNormRow(x + r * width, gamma, width, eps, y + r * width);
}

}  // namespace k3

#endif  // K3SERVE_KERNELS_RMS_NORM_H_
