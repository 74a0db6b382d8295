// The fused KDA decode step (kda_decode.cu) against the CPU layer (attention_nodes/forward/kda.cc):
// a batch of sequences, each with its own history (prompts of different lengths run through the
// CPU, so states and conv caches are non-zero), decodes two tokens on both. The test computes the
// projections the kernel takes with kernels/matmul.h (as kda.cc does) and applies o_proj to its
// output, then compares the layer outputs, the states and the conv caches.
//
// Widths: k3-tiny (4 heads of 32), Kimi Linear's gates (softplus decay, low-rank output gate) at
// the same widths, and k3-slice's (spec §12.7: 96 heads of 128, conv kernel 4; the hidden size,
// which only the projections see, stays small so that the CPU side is quick).
//
// Tolerance: both sides compute in fp32 from the same fp32 inputs; they differ only in the order
// of the sums (the 32-128-term dot products, the conv taps) and in expf/sqrtf versus the CPU's
// vectorized exponential (about 2 ulp): each step adds a few fp32 ulps (~1e-7 relative) per value.
// The bound, max |gpu − cpu| <= 1e-4 · max |cpu| for outputs and states, leaves 100x room; a wrong
// index, a missed decay or a wrong norm shows as an O(1) relative error (on these seeds an fp64
// evaluation of the kernel's contract, kda_decode.h, differs from kda.cc by at most 3e-7). The
// conv caches are copies of the projections, so they must agree to 1e-6.
//
// Without a GPU the GPU cases report themselves skipped ("no GPU"); the shape check runs anyway.
#include "attention_nodes/cuda/kda_decode.h"
#include "attention_nodes/cuda/kda_prefill.h"

#include <cmath>
#include <vector>

#include "kernels/cuda/gpu_test_util.h"
#include "attention_nodes/forward/kda.h"
#include "attention_nodes/cuda/kda_test_inputs.h"
#include "attention_nodes/forward/test_weights.h"
#include "gtest/gtest.h"
#include "kernels/matmul.h"
#include "model/config.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;
using mixer_test::AllClose;
using mixer_test::RandomWeights;
using kda_test::MakeWeights;
using kda_test::Named;
using kda_test::SliceWidths;

constexpr double kBound = 1e-4;

// The kernel's inputs for one decode token per sequence, x [batch, d].
struct Projections {
  std::vector<float> q, k, v, f, beta, gate;
};

Projections Project(const ModelConfig& config, const KdaWeights& w, const std::vector<float>& x,
                    int batch) {
  const int64_t p = config.KdaWidth();
  Projections in;
  auto apply = [&](const WeightMatrix& m, const float* rows) {
    std::vector<float> y(batch * m.rows);
    MatMul(m, rows, batch, y.data());
    return y;
  };
  in.q = apply(w.q_proj, x.data());
  in.k = apply(w.k_proj, x.data());
  in.v = apply(w.v_proj, x.data());
  in.f = apply(w.f_b_proj, apply(w.f_a_proj, x.data()).data());
  in.beta = apply(w.b_proj, x.data());
  in.gate = config.linear_attn.use_full_rank_gate
                ? apply(w.g_proj, x.data())
                : apply(w.g_b_proj, apply(w.g_a_proj, x.data()).data());
  EXPECT_EQ(in.q.size(), static_cast<size_t>(batch * p));
  return in;
}

std::vector<float> Part(const std::vector<float>& v, size_t first, size_t count) {
  return std::vector<float>(v.begin() + first, v.begin() + first + count);
}

void ExpectDecodeMatchesCpu(const ModelConfig& config, int batch, uint32_t seed) {
  RandomWeights rnd(seed);
  const KdaWeights w = MakeWeights(config, &rnd);
  const LinearAttnConfig& la = config.linear_attn;
  const int64_t d = config.hidden_size, h = la.num_heads, kd = la.head_dim, p = h * kd;
  const int64_t window = la.short_conv_kernel_size - 1;
  const size_t state_floats = h * kd * kd, conv_floats = 3 * window * p;

  // Histories of 1, 4, 7, ... tokens on the CPU.
  std::vector<KdaState> states(batch, KdaState(config));
  Scratch scratch;
  for (int b = 0; b < batch; ++b) {
    const std::vector<float> prompt = rnd.Normal((1 + 3 * b) * d, 0.0f, 1.0f);
    std::vector<float> out(prompt.size());
    ASSERT_TRUE(
        KdaForwardBatch(config, w, prompt.data(), {{&states[b], 1 + 3 * b}}, out.data(), &scratch)
            .ok());
  }
  // The device pool: slot 0 unused (random, must stay so), sequence b in slot batch - b.
  const int slots = batch + 1;
  std::vector<float> state_pool = rnd.Normal(slots * state_floats, 0.0f, 1.0f);
  std::vector<float> conv_pool = rnd.Normal(slots * conv_floats, 0.0f, 1.0f);
  std::vector<int32_t> slot_of(batch);
  for (int b = 0; b < batch; ++b) {
    slot_of[b] = batch - b;
    std::copy(states[b].s.begin(), states[b].s.end(),
              state_pool.begin() + slot_of[b] * state_floats);
    const std::vector<float>* conv[3] = {&states[b].conv_q, &states[b].conv_k, &states[b].conv_v};
    for (int m = 0; m < 3; ++m) {
      std::copy(conv[m]->begin(), conv[m]->end(),
                conv_pool.begin() + slot_of[b] * conv_floats + m * window * p);
    }
  }
  const std::vector<float> unused_state = Part(state_pool, 0, state_floats);
  const std::vector<float> unused_conv = Part(conv_pool, 0, conv_floats);
  DeviceArray<float> state_dev(state_pool), conv_dev(conv_pool);
  DeviceArray<int32_t> slots_dev(slot_of);
  DeviceArray<float> q_conv(w.q_conv), k_conv(w.k_conv), v_conv(w.v_conv), dt_bias(w.dt_bias),
      a_log(w.a_log), o_norm(w.o_norm);

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    const std::vector<float> x = rnd.Normal(batch * d, 0.0f, 1.0f);
    const Projections in = Project(config, w, x, batch);
    std::vector<KdaSegment> segments;
    for (KdaState& state : states) segments.push_back(KdaSegment{&state, 1});
    std::vector<float> cpu_out(batch * d);
    ASSERT_TRUE(KdaForwardBatch(config, w, x.data(), segments, cpu_out.data(), &scratch).ok());

    DeviceArray<float> q(in.q), k(in.k), v(in.v), f(in.f), beta(in.beta), gate(in.gate);
    DeviceArray<float> out(batch * p);
    KdaDecodeLaunch launch;
    launch.batch = batch;
    launch.heads = static_cast<int32_t>(h);
    launch.head_dim = static_cast<int32_t>(kd);
    launch.conv_kernel = la.short_conv_kernel_size;
    launch.slots = slots_dev.get();
    launch.state = state_dev.get();
    launch.conv_cache = conv_dev.get();
    launch.q = q.get();
    launch.k = k.get();
    launch.v = v.get();
    launch.q_conv = q_conv.get();
    launch.k_conv = k_conv.get();
    launch.v_conv = v_conv.get();
    launch.decay = f.get();
    launch.dt_bias = dt_bias.get();
    launch.a_log = a_log.get();
    launch.has_lower_bound = la.gate_lower_bound.has_value() ? 1 : 0;
    launch.lower_bound = la.gate_lower_bound.value_or(0.0f);
    launch.beta_logit = beta.get();
    launch.gate = gate.get();
    launch.o_norm = o_norm.get();
    launch.eps = config.rms_norm_eps;
    launch.out = out.get();
    ASSERT_EQ(LaunchKdaDecode(launch, nullptr), 0);
    gpu_test::ExpectDeviceOk();

    const std::vector<float> y = out.Download();
    std::vector<float> gpu_out(batch * d);
    MatMul(w.o_proj, y.data(), batch, gpu_out.data());
    EXPECT_TRUE(AllClose(gpu_out, cpu_out, kBound));
    const std::vector<float> state_after = state_dev.Download();
    const std::vector<float> conv_after = conv_dev.Download();
    for (int b = 0; b < batch; ++b) {
      SCOPED_TRACE(b);
      EXPECT_TRUE(AllClose(Part(state_after, slot_of[b] * state_floats, state_floats), states[b].s,
                           kBound));
      const std::vector<float>* conv[3] = {&states[b].conv_q, &states[b].conv_k,
                                           &states[b].conv_v};
      for (int m = 0; m < 3 && window > 0; ++m) {
        EXPECT_TRUE(AllClose(Part(conv_after, slot_of[b] * conv_floats + m * window * p,
                                  window * p),
                             *conv[m], 1e-6));
      }
    }
    EXPECT_EQ(Part(state_after, 0, state_floats), unused_state);
    EXPECT_EQ(Part(conv_after, 0, conv_floats), unused_conv);
  }
}

// LaunchKdaPrefill (kda_prefill.h: one decode launch per token) against the CPU layer's chunked
// prefill (kda.cc), for a chunk of `tokens` after a history of `history` tokens. The CPU's
// chunked form and its recurrent form agree to 1e-4 (kda_test.cc), and the GPU runs the recurrent
// form: bound 2e-4.
void ExpectPrefillMatchesCpu(const ModelConfig& config, int history, int tokens, uint32_t seed) {
  constexpr double kPrefillBound = 2e-4;
  RandomWeights rnd(seed);
  const KdaWeights w = MakeWeights(config, &rnd);
  const LinearAttnConfig& la = config.linear_attn;
  const int64_t d = config.hidden_size, h = la.num_heads, kd = la.head_dim, p = h * kd;
  const int64_t window = la.short_conv_kernel_size - 1;
  const size_t state_floats = h * kd * kd, conv_floats = 3 * window * p;

  KdaState state(config);
  Scratch scratch;
  const std::vector<float> prompt = rnd.Normal(history * d, 0.0f, 1.0f);
  std::vector<float> warm_out(prompt.size());
  ASSERT_TRUE(
      KdaForwardBatch(config, w, prompt.data(), {{&state, history}}, warm_out.data(), &scratch)
          .ok());
  // Slot 1 holds the sequence; slot 0 is random and must stay so.
  std::vector<float> state_pool = rnd.Normal(2 * state_floats, 0.0f, 1.0f);
  std::vector<float> conv_pool = rnd.Normal(2 * conv_floats, 0.0f, 1.0f);
  std::copy(state.s.begin(), state.s.end(), state_pool.begin() + state_floats);
  const std::vector<float>* conv[3] = {&state.conv_q, &state.conv_k, &state.conv_v};
  for (int m = 0; m < 3; ++m) {
    std::copy(conv[m]->begin(), conv[m]->end(),
              conv_pool.begin() + conv_floats + m * window * p);
  }
  const std::vector<float> unused_state = Part(state_pool, 0, state_floats);

  const std::vector<float> x = rnd.Normal(tokens * d, 0.0f, 1.0f);
  const Projections in = Project(config, w, x, tokens);
  std::vector<float> cpu_out(tokens * d);
  ASSERT_TRUE(
      KdaForwardBatch(config, w, x.data(), {{&state, tokens}}, cpu_out.data(), &scratch).ok());

  DeviceArray<float> state_dev(state_pool), conv_dev(conv_pool);
  DeviceArray<int32_t> slot_dev(std::vector<int32_t>{1});
  DeviceArray<float> q_conv(w.q_conv), k_conv(w.k_conv), v_conv(w.v_conv), dt_bias(w.dt_bias),
      a_log(w.a_log), o_norm(w.o_norm);
  DeviceArray<float> q(in.q), k(in.k), v(in.v), f(in.f), beta(in.beta), gate(in.gate);
  DeviceArray<float> out(tokens * p);
  KdaDecodeLaunch chunk;
  chunk.batch = 1;
  chunk.heads = static_cast<int32_t>(h);
  chunk.head_dim = static_cast<int32_t>(kd);
  chunk.conv_kernel = la.short_conv_kernel_size;
  chunk.slots = slot_dev.get();
  chunk.state = state_dev.get();
  chunk.conv_cache = conv_dev.get();
  chunk.q = q.get();
  chunk.k = k.get();
  chunk.v = v.get();
  chunk.q_conv = q_conv.get();
  chunk.k_conv = k_conv.get();
  chunk.v_conv = v_conv.get();
  chunk.decay = f.get();
  chunk.dt_bias = dt_bias.get();
  chunk.a_log = a_log.get();
  chunk.has_lower_bound = la.gate_lower_bound.has_value() ? 1 : 0;
  chunk.lower_bound = la.gate_lower_bound.value_or(0.0f);
  chunk.beta_logit = beta.get();
  chunk.gate = gate.get();
  chunk.o_norm = o_norm.get();
  chunk.eps = config.rms_norm_eps;
  chunk.out = out.get();
  ASSERT_EQ(LaunchKdaPrefill(chunk, tokens, nullptr), 0);
  gpu_test::ExpectDeviceOk();

  const std::vector<float> y = out.Download();
  std::vector<float> gpu_out(tokens * d);
  MatMul(w.o_proj, y.data(), tokens, gpu_out.data());
  EXPECT_TRUE(AllClose(gpu_out, cpu_out, kPrefillBound));
  const std::vector<float> state_after = state_dev.Download();
  EXPECT_TRUE(AllClose(Part(state_after, state_floats, state_floats), state.s, kPrefillBound));
  EXPECT_EQ(Part(state_after, 0, state_floats), unused_state);
  const std::vector<float> conv_after = conv_dev.Download();
  for (int m = 0; m < 3 && window > 0; ++m) {
    EXPECT_TRUE(AllClose(Part(conv_after, conv_floats + m * window * p, window * p), *conv[m],
                         1e-6));
  }
}

TEST(KdaPrefillGpuTest, MatchesCpuChunkedPrefill) {
  REQUIRE_GPU();
  ExpectPrefillMatchesCpu(Named("k3-tiny"), 5, 150, 4);  // 150 = 9 CPU chunks of 16 + 6
  ExpectPrefillMatchesCpu(Named("kimi-linear-tiny"), 1, 70, 5);
  ExpectPrefillMatchesCpu(SliceWidths(), 3, 40, 6);
}

TEST(KdaPrefillGpuTest, RefusesBadChunks) {
  KdaDecodeLaunch chunk;
  chunk.batch = 2;
  chunk.heads = 4;
  chunk.head_dim = 32;
  chunk.conv_kernel = 4;
  EXPECT_NE(LaunchKdaPrefill(chunk, 3, nullptr), 0);  // one sequence at a time
  chunk.batch = 1;
  EXPECT_NE(LaunchKdaPrefill(chunk, 0, nullptr), 0);
}

TEST(KdaDecodeGpuTest, MatchesCpuAtK3TinyWidths) {
  REQUIRE_GPU();
  ExpectDecodeMatchesCpu(Named("k3-tiny"), 3, 1);
}

TEST(KdaDecodeGpuTest, MatchesCpuWithKimiLinearGates) {
  REQUIRE_GPU();
  ExpectDecodeMatchesCpu(Named("kimi-linear-tiny"), 3, 2);
}

TEST(KdaDecodeGpuTest, MatchesCpuAtK3SliceWidths) {
  REQUIRE_GPU();
  ExpectDecodeMatchesCpu(SliceWidths(), 4, 3);
}

// Refused before anything touches the device, so this runs without a GPU too.
TEST(KdaDecodeGpuTest, RefusesShapesItDoesNotHandle) {
  KdaDecodeLaunch launch;
  launch.batch = 1;
  launch.heads = 4;
  launch.conv_kernel = 4;
  launch.head_dim = 48;
  EXPECT_NE(LaunchKdaDecode(launch, nullptr), 0);
  launch.head_dim = 32;
  launch.conv_kernel = 9;
  EXPECT_NE(LaunchKdaDecode(launch, nullptr), 0);
  launch.conv_kernel = 4;
  launch.batch = 0;
  EXPECT_NE(LaunchKdaDecode(launch, nullptr), 0);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
