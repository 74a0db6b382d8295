// CublasProducts (cuBLAS) on a GPU. Linear against kernels/matmul.h's MatMul on the same
// bf16-representable inputs (both sides then sum exact products in fp32 and differ only in order:
// 1e-5 of the row's largest value), at K3 shapes; the per-head form, with W stored both ways and
// strided heads (MLA's absorption: W_K[h]ᵀ-side and W_V[h]-side products), against an fp64 loop
// over the definition in the header. Without a GPU the GPU cases report themselves skipped ("no
// GPU"); the shape checks need no GPU.
#include "kernels/cuda/cublas_products.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/matmul.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

using gpu_test::DeviceArray;

std::vector<uint16_t> RandomBf16(size_t count, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> bits(count);
  for (uint16_t& b : bits) b = FloatToBf16(normal(rng));
  return bits;
}

std::vector<float> Widen(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16ToFloat(bits[i]);
  return out;
}

// max(a, b), NaN if either is: std::fmax would drop a NaN and pass a broken output.
double Worse(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

// max |a - b| / max |b|, per row of `width`; a NaN fails.
void ExpectRowsClose(const std::vector<float>& got, const std::vector<float>& want, int64_t width,
                     double bound) {
  for (size_t row = 0; row * width < want.size(); ++row) {
    double worst = 0, scale = 0;
    for (int64_t i = row * width; i < static_cast<int64_t>((row + 1) * width); ++i) {
      worst = Worse(worst, std::fabs(got[i] - want[i]));
      scale = Worse(scale, std::fabs(want[i]));
    }
    EXPECT_LE(worst, bound * scale) << "row " << row;
  }
}

void ExpectLinearMatchesMatMul(int64_t n, int64_t k, int64_t m, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "n " << n << " k " << k << " m " << m);
  std::mt19937 rng(seed);
  const std::vector<uint16_t> w = RandomBf16(n * k, 0.05f, rng), x = RandomBf16(m * k, 1.0f, rng);
  std::vector<float> y0(m * n, 0.5f), expected(y0);
  const WeightMatrix matrix{w.data(), WeightType::kBf16, n, k};
  MatMul(matrix, Widen(x).data(), k, m, expected.data(), n, /*accumulate=*/true);

  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  DeviceArray<uint16_t> w_dev(w), x_dev(x);
  DeviceArray<float> y_dev(y0);
  ASSERT_TRUE((*products)->Linear(w_dev.get(), n, k, x_dev.get(), m, y_dev.get(), true).ok());
  gpu_test::ExpectDeviceOk();
  ExpectRowsClose(y_dev.Download(), expected, n, 1e-5);
}

TEST(CublasProductsTest, LinearMatchesMatMul) {
  REQUIRE_GPU();
  ExpectLinearMatchesMatMul(1536, 7168, 1, 1);  // K3's q_a_proj, one token
  ExpectLinearMatchesMatMul(896, 7168, 32, 2);  // the router gate, 32 tokens
  ExpectLinearMatchesMatMul(300, 100, 7, 3);    // odd sizes
}

// MLA's absorbed query (W_K[h] stored [n, c] per head inside kv_b_proj, used untransposed) and
// its output expansion (W_V[h] stored [v, c], used transposed), heads strided in both operands.
TEST(CublasProductsTest, PerHeadProductsMatchTheirDefinition) {
  REQUIRE_GPU();
  constexpr int64_t kHeads = 6, kNope = 128, kV = 128, kC = 512, kTokens = 3;
  std::mt19937 rng(4);
  const std::vector<uint16_t> kv_b = RandomBf16(kHeads * (kNope + kV) * kC, 0.05f, rng);
  const std::vector<uint16_t> q = RandomBf16(kTokens * kHeads * 192, 1.0f, rng);
  const std::vector<float> kv_b_f = Widen(kv_b), q_f = Widen(q);
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  DeviceArray<uint16_t> kv_b_dev(kv_b), q_dev(q);

  // q̃[t, h, 0:c] = Σ_j q[t, h, j] W_K[h][j, :], written into rows of c + 64 per head.
  DeviceArray<float> q_abs(kTokens * kHeads * (kC + 64));
  BatchedProduct absorb;
  absorb.w = kv_b_dev.get();
  absorb.ldw = kC;
  absorb.w_head_stride = (kNope + kV) * kC;
  absorb.w_transposed = false;
  absorb.x = q_dev.get();
  absorb.ldx = kHeads * 192;
  absorb.x_head_stride = 192;
  absorb.y = q_abs.get();
  absorb.ldy = kHeads * (kC + 64);
  absorb.y_head_stride = kC + 64;
  absorb.m = kTokens;
  absorb.n = kC;
  absorb.k = kNope;
  absorb.heads = kHeads;
  ASSERT_TRUE((*products)->Run(absorb).ok());

  // o[t, h, :] = W_V[h] ctx[t, h, :], ctx [t, h, c] (the first c of each q̃ row, as bf16).
  const std::vector<uint16_t> ctx = RandomBf16(kTokens * kHeads * kC, 1.0f, rng);
  const std::vector<float> ctx_f = Widen(ctx);
  DeviceArray<uint16_t> ctx_dev(ctx);
  DeviceArray<float> o(kTokens * kHeads * kV);
  BatchedProduct expand;
  expand.w = kv_b_dev.get() + kNope * kC;
  expand.ldw = kC;
  expand.w_head_stride = (kNope + kV) * kC;
  expand.x = ctx_dev.get();
  expand.ldx = kHeads * kC;
  expand.x_head_stride = kC;
  expand.y = o.get();
  expand.ldy = kHeads * kV;
  expand.y_head_stride = kV;
  expand.m = kTokens;
  expand.n = kV;
  expand.k = kC;
  expand.heads = kHeads;
  ASSERT_TRUE((*products)->Run(expand).ok());
  gpu_test::ExpectDeviceOk();

  const std::vector<float> q_abs_got = q_abs.Download(), o_got = o.Download();
  std::vector<float> q_abs_want, q_abs_kept, o_want;
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* w_k = kv_b_f.data() + h * (kNope + kV) * kC;
      for (int64_t c = 0; c < kC; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < kNope; ++j)
          sum += q_f[(t * kHeads + h) * 192 + j] * w_k[j * kC + c];
        q_abs_want.push_back(static_cast<float>(sum));
        q_abs_kept.push_back(q_abs_got[(t * kHeads + h) * (kC + 64) + c]);
      }
      for (int64_t v = 0; v < kV; ++v) {
        double sum = 0;
        for (int64_t c = 0; c < kC; ++c) {
          sum += w_k[(kNope + v) * kC + c] * ctx_f[(t * kHeads + h) * kC + c];
        }
        o_want.push_back(static_cast<float>(sum));
      }
    }
  }
  ExpectRowsClose(q_abs_kept, q_abs_want, kC, 1e-5);
  ExpectRowsClose(o_got, o_want, kV, 1e-5);
}

TEST(CublasProductsTest, AddsRows) {
  REQUIRE_GPU();
  std::vector<float> x(1000), y(1000), want(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = 0.5f * i;
    y[i] = 3.0f - i;
    want[i] = y[i] + x[i];
  }
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  DeviceArray<float> x_dev(x), y_dev(y);
  ASSERT_TRUE((*products)->Add(x_dev.get(), y_dev.get(), 1000).ok());
  gpu_test::ExpectDeviceOk();
  EXPECT_EQ(y_dev.Download(), want);  // exact: sums of small multiples of 0.5
}

TEST(CublasProductsTest, RefusesBadShapes) {
  REQUIRE_GPU();  // creating a cuBLAS handle needs a device
  auto products = CublasProducts::Create(nullptr);
  ASSERT_TRUE(products.ok()) << products.status();
  BatchedProduct p;
  p.m = 1;
  p.n = 8;
  p.k = 16;
  p.ldw = 8;  // below k for a transposed W
  p.ldx = 16;
  p.ldy = 8;
  EXPECT_EQ((*products)->Run(p).code(), absl::StatusCode::kInvalidArgument);
  p.ldw = 16;
  p.m = 0;
  EXPECT_EQ((*products)->Run(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  k3::have_gpu = k3::gpu_test::HaveGpu();
  return RUN_ALL_TESTS();
}
