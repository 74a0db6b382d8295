// The attention kernels' own device code (kda_decode_kernel.inc, mla_decode_kernels.inc) run on the
// CPU under simt_emulation.h, one std::thread per CUDA thread, against fp64 evaluations of their
// headers' contracts: so their indexing, shared-memory use and shuffles are checked on every
// machine, GPU or not (the gpu tests check them on the device
// against the CPU layers). Small shapes keep the thread count low: k3-tiny widths, and K3's widths
// with few heads and sequences.
//
// Bounds: the KDA and MLA kernels compute in fp32 from the same inputs as the fp64 reference (sums
// of 32-576 terms: ~1e-6 relative), so 1e-4.
#include "kernels/cuda/simt_emulation.h"
// The kernels, after the emulation that defines what they use of CUDA.
#include "attention_nodes/cuda/kda_decode_kernel.inc"
#include "attention_nodes/cuda/mla_decode_kernels.inc"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// max |actual − expected| / max |expected|.
double RelativeError(const std::vector<float>& actual, const std::vector<double>& expected) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double diff = std::fabs(actual[i] - expected[i]);
    worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
    scale = std::max(scale, std::fabs(expected[i]));
  }
  return worst / scale;
}

struct KdaInputs {
  int heads, batch;
  std::vector<float> state, conv, q, k, v, q_conv, k_conv, v_conv, f, dt_bias, a_log, beta, gate,
      o_norm;
  std::vector<int32_t> slots;
};

KdaInputs RandomKdaInputs(int kdim, int heads, int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](size_t n, float scale, float offset = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * normal(rng);
    return v;
  };
  const int p = heads * kdim, window = 3, slots = batch + 1;
  KdaInputs in{heads, batch};
  in.state = random(static_cast<size_t>(slots) * heads * kdim * kdim, 0.1f);
  in.conv = random(static_cast<size_t>(slots) * 3 * window * p, 1.0f);
  in.q = random(batch * p, 1.0f);
  in.k = random(batch * p, 1.0f);
  in.v = random(batch * p, 1.0f);
  in.q_conv = random(p * 4, 0.3f);
  in.k_conv = random(p * 4, 0.3f);
  in.v_conv = random(p * 4, 0.3f);
  in.f = random(batch * p, 1.0f);
  in.dt_bias = random(p, 0.5f);
  in.a_log = random(heads, 0.5f);
  in.beta = random(batch * heads, 1.0f);
  in.gate = random(batch * p, 1.0f);
  in.o_norm = random(kdim, 0.1f, 1.0f);
  for (int b = 0; b < batch; ++b) in.slots.push_back(batch - b);  // slot 0 unused
  return in;
}

// The step of kda_decode.h in fp64: outputs [batch, P], then the new state of every slot.
std::vector<double> KdaReference(const KdaInputs& in, int kdim, bool lower_bound,
                                 std::vector<double>* state) {
  const int h = in.heads, p = h * kdim, window = 3;
  state->assign(in.state.begin(), in.state.end());
  std::vector<double> out(in.batch * p);
  for (int b = 0; b < in.batch; ++b) {
    const int64_t slot = in.slots[b];
    std::vector<double> x[3];
    const std::vector<float>* raw[3] = {&in.q, &in.k, &in.v};
    const std::vector<float>* weight[3] = {&in.q_conv, &in.k_conv, &in.v_conv};
    for (int m = 0; m < 3; ++m) {
      for (int c = 0; c < p; ++c) {
        double acc = (*weight[m])[c * 4 + window] * (*raw[m])[b * p + c];
        for (int t = 0; t < window; ++t) {
          acc += (*weight[m])[c * 4 + t] * in.conv[((slot * 3 + m) * window + t) * p + c];
        }
        x[m].push_back(acc * Sigmoid(acc));
      }
    }
    for (int head = 0; head < h; ++head) {
      const double* q = x[0].data() + head * kdim;
      const double* k = x[1].data() + head * kdim;
      double sq = 0, sk = 0;
      for (int j = 0; j < kdim; ++j) {
        sq += q[j] * q[j];
        sk += k[j] * k[j];
      }
      const double a = std::exp(in.a_log[head]), beta = Sigmoid(in.beta[b * h + head]);
      double* s = state->data() + (slot * h + head) * kdim * kdim;
      const double q_scale = 1.0 / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(kdim));
      std::vector<double> o(kdim, 0.0);
      for (int m = 0; m < kdim; ++m) {
        double predicted = 0;
        for (int j = 0; j < kdim; ++j) {
          const double z = in.f[b * p + head * kdim + j] + in.dt_bias[head * kdim + j];
          const double g = lower_bound ? -5.0 * Sigmoid(a * z) : -a * std::log1p(std::exp(z));
          s[j * kdim + m] *= std::exp(g);
          predicted += s[j * kdim + m] * k[j] / std::sqrt(sk + 1e-6);
        }
        const double u = beta * (x[2][head * kdim + m] - predicted);
        for (int j = 0; j < kdim; ++j) {
          s[j * kdim + m] += k[j] / std::sqrt(sk + 1e-6) * u;
          o[m] += s[j * kdim + m] * q[j] * q_scale;
        }
      }
      double mean_square = 0;
      for (double e : o) mean_square += e * e / kdim;
      for (int m = 0; m < kdim; ++m) {
        const int c = head * kdim + m;
        out[b * p + c] = o[m] / std::sqrt(mean_square + 1e-5) * in.o_norm[m] *
                         Sigmoid(in.gate[b * p + c]);
      }
    }
  }
  return out;
}

// The launch over `in` (conv kernel 4, the lower-bound gate of -5, eps 1e-5), writing `out`.
KdaDecodeLaunch LaunchOf(KdaInputs& in, int kdim, float* out) {
  KdaDecodeLaunch l;
  l.batch = in.batch;
  l.heads = in.heads;
  l.head_dim = kdim;
  l.conv_kernel = 4;
  l.slots = in.slots.data();
  l.state = in.state.data();
  l.conv_cache = in.conv.data();
  l.q = in.q.data();
  l.k = in.k.data();
  l.v = in.v.data();
  l.q_conv = in.q_conv.data();
  l.k_conv = in.k_conv.data();
  l.v_conv = in.v_conv.data();
  l.decay = in.f.data();
  l.dt_bias = in.dt_bias.data();
  l.a_log = in.a_log.data();
  l.has_lower_bound = 1;
  l.lower_bound = -5.0f;
  l.beta_logit = in.beta.data();
  l.gate = in.gate.data();
  l.o_norm = in.o_norm.data();
  l.eps = 1e-5f;
  l.out = out;
  return l;
}

template <int kDim>
void ExpectKdaKernelMatches(int heads, int batch, bool lower_bound, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "K " << kDim << ", " << heads << " heads, batch " << batch);
  KdaInputs in = RandomKdaInputs(kDim, heads, batch, seed);
  std::vector<double> expected_state;
  const std::vector<double> expected = KdaReference(in, kDim, lower_bound, &expected_state);
  const std::vector<float> conv_before = in.conv;
  std::vector<float> out(batch * heads * kDim, NAN);
  KdaDecodeLaunch l = LaunchOf(in, kDim, out.data());
  l.has_lower_bound = lower_bound ? 1 : 0;
  simt::RunGrid({heads, batch, 1}, {kDim * (kDim / kda_kernel::kRowsPerThread), 1, 1},
                [&] { kda_kernel::KdaDecodeKernel<kDim>(l); });
  EXPECT_LT(RelativeError(out, expected), 1e-4);
  EXPECT_LT(RelativeError(in.state, expected_state), 1e-4);  // slot 0 included: must not move
  // Each used slot's conv cache shifted by one row and took the raw input.
  const int p = heads * kDim, window = 3;
  for (int b = 0; b < batch; ++b) {
    const int64_t slot = in.slots[b];
    const std::vector<float>* raw[3] = {&in.q, &in.k, &in.v};
    for (int m = 0; m < 3; ++m) {
      for (int c = 0; c < p; ++c) {
        for (int t = 0; t < window; ++t) {
          const float want = t + 1 < window
                                 ? conv_before[((slot * 3 + m) * window + t + 1) * p + c]
                                 : (*raw[m])[b * p + c];
          ASSERT_EQ(in.conv[((slot * 3 + m) * window + t) * p + c], want);
        }
      }
    }
  }
}

TEST(KernelEmulationTest, KdaDecode) {
  ExpectKdaKernelMatches<32>(4, 3, true, 1);
  ExpectKdaKernelMatches<32>(4, 2, false, 2);
  ExpectKdaKernelMatches<64>(3, 2, true, 3);
  ExpectKdaKernelMatches<128>(2, 2, true, 4);
}

// A prefill chunk in one launch (KdaDecodeLaunch::tokens > 1): each sequence's tokens one after
// another, against the fp64 step applied token by token, the conv caches shifted between tokens
// as decode shifts them (the state carried between tokens in fp32, as the kernel keeps it).
template <int kDim>
void ExpectKdaChunkMatches(int heads, int batch, int tokens, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "K " << kDim << ", " << heads << " heads, batch " << batch
                                  << ", " << tokens << " tokens");
  KdaInputs in = RandomKdaInputs(kDim, heads, batch * tokens, seed);  // rows b * tokens + t
  in.batch = batch;
  in.slots.resize(batch);  // distinct slots, as in decode
  const int p = heads * kDim, window = 3;

  // The reference, token by token.
  std::vector<double> expected(static_cast<size_t>(batch) * tokens * p);
  KdaInputs step = in;
  for (int t = 0; t < tokens; ++t) {
    auto rows_of = [&](const std::vector<float>& all, int width) {
      std::vector<float> picked;
      for (int b = 0; b < batch; ++b) {
        const auto first = all.begin() + (static_cast<int64_t>(b) * tokens + t) * width;
        picked.insert(picked.end(), first, first + width);
      }
      return picked;
    };
    step.q = rows_of(in.q, p);
    step.k = rows_of(in.k, p);
    step.v = rows_of(in.v, p);
    step.f = rows_of(in.f, p);
    step.gate = rows_of(in.gate, p);
    step.beta = rows_of(in.beta, heads);
    std::vector<double> state;
    const std::vector<double> out = KdaReference(step, kDim, true, &state);
    for (int b = 0; b < batch; ++b) {
      std::copy(out.begin() + static_cast<int64_t>(b) * p, out.begin() + (b + 1) * int64_t{p},
                expected.begin() + (static_cast<int64_t>(b) * tokens + t) * p);
    }
    step.state.assign(state.begin(), state.end());
    const std::vector<float>* raw[3] = {&step.q, &step.k, &step.v};
    for (int b = 0; b < batch; ++b) {
      const int64_t slot = in.slots[b];
      for (int m = 0; m < 3; ++m) {
        float* cache = step.conv.data() + (slot * 3 + m) * window * p;
        for (int c = 0; c < p; ++c) {
          for (int w = 0; w + 1 < window; ++w) cache[w * p + c] = cache[(w + 1) * p + c];
          cache[(window - 1) * p + c] = (*raw[m])[static_cast<int64_t>(b) * p + c];
        }
      }
    }
  }

  std::vector<float> out(static_cast<size_t>(batch) * tokens * p, NAN);
  KdaDecodeLaunch l = LaunchOf(in, kDim, out.data());
  l.tokens = tokens;
  simt::RunGrid({heads, batch, 1}, {kDim * (kDim / kda_kernel::kRowsPerThread), 1, 1},
                [&] { kda_kernel::KdaChunkKernel<kDim>(l); });
  EXPECT_LT(RelativeError(out, expected), 1e-4);
  const std::vector<double> expected_state(step.state.begin(), step.state.end());
  EXPECT_LT(RelativeError(in.state, expected_state), 1e-4);
  EXPECT_EQ(in.conv, step.conv);  // raw inputs moved, never computed on
}

TEST(KernelEmulationTest, KdaPrefillChunkInOneLaunch) {
  ExpectKdaChunkMatches<32>(3, 2, 5, 11);
  ExpectKdaChunkMatches<64>(2, 1, 4, 12);
  ExpectKdaChunkMatches<128>(1, 2, 3, 13);
}

// MLA: random bf16 pages (each sequence's pages interleaved with the others'), random queries;
// the split kernel, then the combine kernel, against an fp64 softmax.
void ExpectMlaKernelsMatch(int heads, int c, int r, int keys_per_split,
                           const std::vector<int>& lengths, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << heads << " heads, c " << c << ", r " << r);
  const int batch = static_cast<int>(lengths.size()), width = c + r, page_size = 64;
  const int max_length = *std::max_element(lengths.begin(), lengths.end());
  const int max_pages = (max_length + page_size - 1) / page_size;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> cache(static_cast<size_t>(batch) * max_pages * page_size * width);
  for (uint16_t& v : cache) v = simt::RoundToBf16(normal(rng));
  std::vector<int32_t> table(batch * max_pages);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < max_pages; ++i) table[b * max_pages + i] = (max_pages - 1 - i) * batch + b;
  }
  std::vector<float> q(static_cast<size_t>(batch) * heads * width);
  for (float& v : q) v = 0.08f * normal(rng);  // scores of std ~2

  MlaDecodeLaunch l;
  l.batch = batch;
  l.heads = heads;
  l.kv_lora_rank = c;
  l.rope_dim = r;
  l.page_size = page_size;
  l.max_pages = max_pages;
  l.max_length = max_length;
  l.keys_per_split = keys_per_split;
  l.lengths = lengths.data();
  l.block_table = table.data();
  l.cache = cache.data();
  l.q = q.data();
  const int splits = (max_length + keys_per_split - 1) / keys_per_split;
  std::vector<float> workspace(static_cast<size_t>(batch) * splits * heads * (c + 2), NAN);
  std::vector<float> out(static_cast<size_t>(batch) * heads * c, NAN);
  l.workspace = workspace.data();
  l.out = out.data();
  const int per_block = mla_kernels::kHeadsPerBlock;
  simt::RunGrid({splits, (heads + per_block - 1) / per_block, batch}, {mla_kernels::kThreads, 1, 1},
                [&] { mla_kernels::MlaDecodeSplitKernel(l); });
  simt::RunGrid({heads, batch, 1}, {mla_kernels::kThreads, 1, 1},
                [&] { mla_kernels::MlaDecodeCombineKernel(l, splits); });

  std::vector<double> expected;
  for (int b = 0; b < batch; ++b) {
    auto row = [&](int n) {
      const int64_t page = table[b * max_pages + n / page_size];
      return cache.data() + (page * page_size + n % page_size) * width;
    };
    for (int head = 0; head < heads; ++head) {
      const float* qh = q.data() + (static_cast<int64_t>(b) * heads + head) * width;
      std::vector<double> scores(lengths[b]);
      for (int n = 0; n < lengths[b]; ++n) {
        for (int d = 0; d < width; ++d) scores[n] += double{qh[d]} * simt::Bf16Half(row(n)[d], 0);
      }
      const double best = *std::max_element(scores.begin(), scores.end());
      std::vector<double> sum(c, 0.0);
      double total = 0;
      for (int n = 0; n < lengths[b]; ++n) {
        const double weight = std::exp(scores[n] - best);
        total += weight;
        for (int d = 0; d < c; ++d) sum[d] += weight * simt::Bf16Half(row(n)[d], 0);
      }
      for (double v : sum) expected.push_back(v / total);
    }
  }
  EXPECT_LT(RelativeError(out, expected), 1e-4);
}

TEST(KernelEmulationTest, MlaDecodeAtK3TinyWidths) {
  ExpectMlaKernelsMatch(4, 64, 16, 32, {1, 63, 200}, 5);
}

TEST(KernelEmulationTest, MlaDecodeAtK3Widths) {
  // 20 heads: a partly filled 8-head block; 100 keys in runs of 32: a last run of 4.
  ExpectMlaKernelsMatch(20, 512, 64, 32, {1, 100}, 6);
}

}  // namespace
}  // namespace k3
