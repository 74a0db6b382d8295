#include "kernels/gated_mlp.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// GluCombine's formula in double precision.
double ReferenceCombine(const GluParams& p, double a, double b) {
  const double sigmoid = 1.0 / (1.0 + std::exp(-a));
  const double capped = p.linear_beta > 0.f ? p.linear_beta * std::tanh(b / p.linear_beta) : b;
  const double activated = p.situ ? p.beta * std::tanh(a / p.beta) * sigmoid : a * sigmoid;
  return activated * capped;
}

// The vector code against the double-precision formula, for SiTU (capped and not) and SwiGLU,
// at values around the series cut-over (|x| = 0.3 after scaling), near zero, tiny, large and
// saturating, and random ones; 37 values leave a tail shorter than a vector.
TEST(GluCombineRowTest, MatchesTheFormulaInDoublePrecision) {
  std::vector<float> values = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-6f, -1e-6f, 0.01f, -0.01f,
                               0.299f, 0.301f, 1.19f, 1.21f, -1.2f, 1.0f, -1.0f, 3.0f, -3.0f,
                               7.49f, 7.51f, 10.0f, -10.0f, 30.0f, -30.0f, 80.0f, -80.0f,
                               100.0f, -100.0f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-40.0f, 40.0f);
  while (values.size() < 37) values.push_back(dist(rng));
  const GluParams params[] = {{true, 4.0f, 25.0f}, {true, 4.0f, 0.0f}, {false, 0.0f, 0.0f}};
  for (const GluParams& p : params) {
    SCOPED_TRACE("situ=" + std::to_string(p.situ) + " linear_beta=" + std::to_string(p.linear_beta));
    for (size_t shift = 0; shift < values.size(); ++shift) {
      std::vector<float> gate(values.size()), up(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        gate[i] = values[i];
        up[i] = values[(i + shift) % values.size()];
      }
      const std::vector<float> a = gate;
      GluCombineRow(p, gate.data(), up.data(), static_cast<int64_t>(gate.size()));
      for (size_t i = 0; i < gate.size(); ++i) {
        const double expected = ReferenceCombine(p, a[i], up[i]);
        EXPECT_NEAR(gate[i], expected, 4e-6 * std::abs(expected) + 1e-37)
            << "a=" << a[i] << " b=" << up[i];
        // The scalar path agrees as well (it is what the vector code replaced).
        EXPECT_NEAR(GluCombine(p, a[i], up[i]), expected, 4e-6 * std::abs(expected) + 1e-37);
      }
    }
  }
}

}  // namespace
}  // namespace k3
