// Test-only: the cases both sampling tests run (sample_test.cc on a GPU, sample_emulation_test.cc
// on the CPU): random rows of logits with the CPU sampler's picks and the uniform numbers that the
// device draws with, from the same seed.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_CASES_H_
#define K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_CASES_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention_nodes/cuda/sample.h"
#include "attention_nodes/sampler.h"

namespace k3::sample_test {

struct SampleCase {
  std::vector<float> logits;  // [rows, stride]
  int64_t stride = 0;
  int32_t vocab = 0;
  std::vector<DeviceSamplingRow> params;  // [rows]
  std::vector<int32_t> expected;          // [rows]: the CPU sampler's picks (-1: non-finite)
};

// `rows` consecutive tokens of one sequence sampled with `options` by attention_nodes' Sampler,
// each from its own random row (normal, standard deviation 3, so that top_k and top_p cut), the
// row index `non_finite_row` (if in range) holding a NaN. Equal logits are planted in every row
// (ids 3 and 1 share the row's maximum when `tie_at_top`), so that ties are ranked too.
inline SampleCase MakeSampleCase(const SamplingOptions& options, int rows, int32_t vocab,
                                 uint32_t logits_seed, bool tie_at_top, int non_finite_row = -1) {
  SampleCase c;
  c.vocab = vocab;
  c.stride = vocab + 5;
  c.logits.assign(static_cast<size_t>(rows) * c.stride, 0.0f);
  std::mt19937 rng(logits_seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Sampler sampler(options);
  std::mt19937_64 draws(options.seed);
  for (int r = 0; r < rows; ++r) {
    float* row = c.logits.data() + r * c.stride;
    float high = -INFINITY;
    for (int32_t i = 0; i < vocab; ++i) high = std::fmax(high, row[i] = normal(rng));
    row[vocab / 2] = row[vocab / 3] = row[vocab / 4];
    if (tie_at_top) row[3] = row[1] = high + 1.0f;
    if (r == non_finite_row) {
      row[vocab - 1] = NAN;
      c.expected.push_back(-1);
    } else {
      c.expected.push_back(sampler.Next(row, vocab));
    }
    DeviceSamplingRow params{options.temperature, options.top_p, options.top_k, 0.0};
    // The CPU sampler draws only when it samples; a NaN row is skipped on both sides.
    if (options.temperature > 0.0f && r != non_finite_row) params.uniform = SampleUniform(draws);
    c.params.push_back(params);
  }
  return c;
}

// The sampling configurations both tests cover.
inline std::vector<SamplingOptions> SampleOptionsToCover() {
  return {
      {.temperature = 0.0f},                            // greedy
      {.temperature = 1.0f, .seed = 7},                 // the whole vocabulary
      {.temperature = 0.7f, .top_k = 20, .seed = 8},    // top-k
      {.temperature = 1.3f, .top_p = 0.9f, .seed = 9},  // top-p
      {.temperature = 0.5f, .top_p = 0.5f, .top_k = 50, .seed = 10},
      {.temperature = 2.0f, .top_k = 1, .seed = 11},  // one kept token
  };
}

}  // namespace k3::sample_test

#endif  // K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_CASES_H_
