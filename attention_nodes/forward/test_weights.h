// Test-only: random weights held in memory, as WeightMatrix views like the loader hands out, and
// comparisons of float results against fp64 references.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_TEST_WEIGHTS_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_TEST_WEIGHTS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/matmul.h"

namespace k3::mixer_test {

// Owns the storage behind every matrix it hands out; keep it alive while they are used.
class RandomWeights {
 public:
  explicit RandomWeights(uint32_t seed) : rng_(seed) {}

  // N(0, stddev²) values rounded to bf16 (so both storage types hold exactly the same numbers).
  WeightMatrix Matrix(int64_t rows, int64_t cols, float stddev,
                      WeightType type = WeightType::kBf16) {
    std::normal_distribution<float> normal(0.0f, stddev);
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.type = type;
    if (type == WeightType::kBf16) {
      std::vector<uint16_t>& data = bf16_.emplace_back(rows * cols);
      for (uint16_t& v : data) v = FloatToBf16(normal(rng_));
      m.data = data.data();
    } else {
      std::vector<float>& data = f32_.emplace_back(rows * cols);
      for (float& v : data) v = Bf16ToFloat(FloatToBf16(normal(rng_)));
      m.data = data.data();
    }
    return m;
  }

  std::vector<float> Normal(int64_t n, float mean, float stddev) {
    std::normal_distribution<float> normal(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_);
    return v;
  }

  std::vector<float> Uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> uniform(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = uniform(rng_);
    return v;
  }

 private:
  std::mt19937 rng_;
  std::deque<std::vector<uint16_t>> bf16_;
  std::deque<std::vector<float>> f32_;
};

// max_i |actual_i − expected_i| <= rtol · max_i |expected_i|, and the sizes agree.
template <typename A, typename E>
::testing::AssertionResult AllClose(const A& actual, const E& expected, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  double scale = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(expected[i])));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff =
        std::fabs(static_cast<double>(actual[i]) - static_cast<double>(expected[i]));
    if (!(diff <= worst)) {  // also catches NaN
      worst = std::isnan(diff) ? INFINITY : diff;
      worst_at = i;
    }
  }
  if (scale == 0.0) return ::testing::AssertionFailure() << "expected values are all zero";
  if (worst <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |diff| " << worst << " at " << worst_at << " (actual " << actual[worst_at]
         << ", expected " << expected[worst_at] << ") exceeds " << rtol << " x " << scale;
}

}  // namespace k3::mixer_test

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_TEST_WEIGHTS_H_
