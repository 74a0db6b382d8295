// Test-only: the KDA layer inputs the GPU KDA tests share (kda_decode_test.cc,
// gpu_kda_layer_test.cc): spec §12.3-style random weights and the configs they run at.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_KDA_TEST_INPUTS_H_
#define K3SERVE_ATTENTION_NODES_CUDA_KDA_TEST_INPUTS_H_

#include <cmath>
#include <cstdint>

#include "absl/status/statusor.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/weights.h"

namespace k3::kda_test {

using mixer_test::RandomWeights;

// Spec §12.3-style weights (as kda_test.cc): linear N(0, std²), norm 1 + N(0, 0.1²),
// A_log = log U(1, 16), dt_bias N(0, 0.5²), convs U(-0.5, 0.5).
inline KdaWeights MakeWeights(const ModelConfig& config, RandomWeights* rnd) {
  const LinearAttnConfig& la = config.linear_attn;
  const int64_t h = la.num_heads, k = la.head_dim, p = h * k, d = config.hidden_size;
  const int kernel = la.short_conv_kernel_size;
  constexpr float kStd = 0.05f;
  KdaWeights w;
  w.q_proj = rnd->Matrix(p, d, kStd);
  w.k_proj = rnd->Matrix(p, d, kStd);
  w.v_proj = rnd->Matrix(p, d, kStd);
  w.q_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.k_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.v_conv = rnd->Uniform(p * kernel, -0.5f, 0.5f);
  w.f_a_proj = rnd->Matrix(k, d, kStd);
  w.f_b_proj = rnd->Matrix(p, k, kStd);
  w.dt_bias = rnd->Normal(p, 0.0f, 0.5f);
  for (float u : rnd->Uniform(h, 1.0f, 16.0f)) w.a_log.push_back(std::log(u));
  w.b_proj = rnd->Matrix(h, d, kStd);
  if (la.use_full_rank_gate) {
    w.g_proj = rnd->Matrix(p, d, kStd);
  } else {
    w.g_a_proj = rnd->Matrix(k, d, kStd);
    w.g_b_proj = rnd->Matrix(p, k, kStd);
  }
  w.o_norm = rnd->Normal(k, 1.0f, 0.1f);
  w.o_proj = rnd->Matrix(d, p, kStd);
  return w;
}

inline ModelConfig Named(const char* name) {
  absl::StatusOr<ModelConfig> config = NamedConfig(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// k3-tiny with k3-slice's KDA widths (96 heads of 128); the hidden size, which only the
// projections see, stays small so that the CPU side is quick.
inline ModelConfig SliceWidths() {
  ModelConfig config = Named("k3-tiny");
  config.linear_attn.num_heads = 96;
  config.linear_attn.head_dim = 128;
  return config;
}

}  // namespace k3::kda_test

#endif  // K3SERVE_ATTENTION_NODES_CUDA_KDA_TEST_INPUTS_H_
