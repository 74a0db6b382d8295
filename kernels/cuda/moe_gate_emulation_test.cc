// The MoE gate's device code (moe_gate_kernel.inc) run on the CPU under simt_emulation.h, one
// std::thread per CUDA thread, against an fp64 evaluation of moe_gate.h's contract written here
// (a full sort of the choices), so that its shared-memory tree, the ownership of experts by
// threads and the slot bookkeeping are checked on every machine, GPU or not (moe_gate_test.cc
// checks the compiled kernel on a GPU against router/gate.cc).
//
// Bounds: scores are one fp32 sigmoid (three roundings: within 3e-7 relative of fp64); weights are
// a ratio of fp32 sums of at most 32 terms: 1e-6 relative. Ids must agree exactly: the random
// choices are far apart against those errors (checked per case), and the planted ties are exact.
#include "kernels/cuda/simt_emulation.h"
// After the emulation, which defines what the device code uses of CUDA.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/moe_gate.h"
#include "kernels/cuda/moe_gate_kernel.inc"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

struct GateCase {
  int tokens, num_experts, top_k;
  bool renormalize, with_bias;
  float scaling;
};

struct GateResult {
  std::vector<float> scores, weights;
  std::vector<int32_t> ids;
};

GateResult RunEmulated(const GateCase& c, const std::vector<float>& logits, int64_t stride,
                       const std::vector<float>& bias) {
  GateResult out;
  out.scores.assign(static_cast<size_t>(c.tokens) * c.num_experts, NAN);
  out.ids.assign(static_cast<size_t>(c.tokens) * c.top_k, -1);
  out.weights.assign(out.ids.size(), NAN);
  MoeGateArgs args;
  args.logits = logits.data();
  args.logits_stride = stride;
  args.bias = c.with_bias ? bias.data() : nullptr;
  args.tokens = c.tokens;
  args.num_experts = c.num_experts;
  args.top_k = c.top_k;
  args.renormalize = c.renormalize;
  args.scaling = c.scaling;
  args.scores = out.scores.data();
  args.ids = out.ids.data();
  args.weights = out.weights.data();
  simt::RunGrid({c.tokens, 1, 1}, {kMoeGateThreads, 1, 1}, [&] { MoeGateKernel(args); });
  return out;
}

// The contract in fp64: sort every expert by (choice descending, id ascending), take top_k.
void ExpectMatchesReference(const GateCase& c, const std::vector<float>& logits, int64_t stride,
                            const std::vector<float>& bias, const GateResult& got) {
  for (int t = 0; t < c.tokens; ++t) {
    SCOPED_TRACE(testing::Message() << "token " << t);
    std::vector<double> score(c.num_experts), choice(c.num_experts);
    for (int e = 0; e < c.num_experts; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[t * stride + e])));
      choice[e] = score[e] + (c.with_bias ? bias[e] : 0.0);
      ASSERT_NEAR(got.scores[t * c.num_experts + e], score[e], 3e-7 * score[e]) << e;
    }
    std::vector<int> order(c.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return choice[a] > choice[b]; });
    // The fp32 kernel can rank two experts only as far apart as its rounding: none may be close.
    double sum = 0;
    for (int s = 0; s < c.top_k; ++s) sum += score[order[s]];
    for (int s = 0; s < c.top_k; ++s) {
      const double gap = choice[order[s]] - choice[order[s + 1 < c.num_experts ? s + 1 : s]];
      ASSERT_TRUE(gap == 0 || gap > 1e-5) << "a near tie: pick another seed";
      EXPECT_EQ(got.ids[t * c.top_k + s], order[s]) << "slot " << s;
      double weight = score[order[s]];
      if (c.renormalize && c.top_k > 1) weight /= sum;
      weight *= c.scaling;
      EXPECT_NEAR(got.weights[t * c.top_k + s], weight, 1e-6 * std::fabs(weight)) << "slot " << s;
    }
  }
}

void CheckRandom(const GateCase& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.num_experts << " experts, top " << c.top_k);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t stride = c.num_experts + 3;  // rows of a wider product
  std::vector<float> logits(c.tokens * stride), bias(c.num_experts);
  for (float& x : logits) x = normal(rng);
  for (float& b : bias) b = 0.1f * normal(rng);
  ExpectMatchesReference(c, logits, stride, bias, RunEmulated(c, logits, stride, bias));
}

TEST(MoeGateEmulationTest, K3WidthWithBias) { CheckRandom({2, 896, 16, true, true, 2.5f}, 1); }

TEST(MoeGateEmulationTest, TinyWidthsWithoutBiasOrRenormalization) {
  CheckRandom({3, 8, 2, false, false, 1.0f}, 2);
  CheckRandom({2, 300, 1, true, false, 1.0f}, 3);
  CheckRandom({1, 1024, 32, true, true, 1.0f}, 4);
}

// Equal choices go to the lower expert id, and the bias picks without weighting.
TEST(MoeGateEmulationTest, TiesAndBias) {
  const GateCase c{1, 600, 4, true, true, 1.0f};
  std::vector<float> logits(600, 0.0f), bias(600, 0.0f);
  bias[599] = 1.0f;  // chosen first, weighted by its score alone
  bias[300] = 0.5f;
  // Experts 257, 513 and 3 tie on their choice: lower ids first, across the threads that own them.
  for (int e : {513, 257, 3}) logits[e] = 1.0f;
  const GateResult got = RunEmulated(c, logits, 600, bias);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{599, 300, 3, 257}));
  const float half = 0.5f, high = 1.0f / (1.0f + std::exp(-1.0f));
  const float sum = half + half + high + high;
  EXPECT_FLOAT_EQ(got.weights[0], half / sum);
  EXPECT_FLOAT_EQ(got.weights[2], high / sum);
}

// A NaN row (its logits NaN, as from a NaN hidden row) gets top_k distinct, in-range experts
// (the lowest ids: every choice ranks as -inf) and NaN weights, so its output is NaN and its
// request fails on its logits as on the CPU; the next row is untouched. One NaN logit in an
// otherwise finite row only ranks that expert last.
TEST(MoeGateEmulationTest, NaNRowsGetInRangeIdsAndNaNWeights) {
  const GateCase c{3, 300, 4, true, true, 1.0f};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(3 * 300), bias(300);
  for (float& x : logits) x = normal(rng);
  for (float& b : bias) b = 0.1f * normal(rng);
  for (int e = 0; e < 300; ++e) logits[e] = NAN;  // row 0
  logits[300 + 7] = NAN;                          // one logit of row 1
  const GateResult got = RunEmulated(c, logits, 300, bias);
  EXPECT_EQ(std::vector<int32_t>(got.ids.begin(), got.ids.begin() + 4),
            (std::vector<int32_t>{0, 1, 2, 3}));
  for (int s = 0; s < 4; ++s) EXPECT_TRUE(std::isnan(got.weights[s])) << "slot " << s;
  for (int s = 4; s < 12; ++s) {
    EXPECT_GE(got.ids[s], 0);
    EXPECT_LT(got.ids[s], 300);
    EXPECT_NE(got.ids[s], 7) << "the NaN expert of row 1 ranks last";
    EXPECT_TRUE(std::isfinite(got.weights[s])) << "slot " << s;
  }
  // Row 2 is as the fp64 contract says.
  GateCase last = c;
  last.tokens = 1;
  GateResult row2;
  row2.scores.assign(got.scores.begin() + 600, got.scores.end());
  row2.ids.assign(got.ids.begin() + 8, got.ids.end());
  row2.weights.assign(got.weights.begin() + 8, got.weights.end());
  ExpectMatchesReference(last, std::vector<float>(logits.begin() + 600, logits.end()), 300, bias,
                         row2);
}

}  // namespace
}  // namespace k3
