#include "kernels/matmul.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/batch_invariance.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/kernel_isa.h"
#include "kernels/matmul_internal.h"
#include "kernels/mxfp4.h"

namespace k3 {
namespace {

using internal::MatMulKernel;

// Weights of either type with a chosen misalignment of the data pointer.
class TestWeights {
 public:
  TestWeights(WeightType type, int64_t rows, int64_t cols, int misalign_elements, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    if (type == WeightType::kMxfp4) {
      // Every code; scales 2^-7 .. 2^3 (misalignment in bytes).
      codes_.resize(rows * cols / 2 + misalign_elements);
      scales_.resize(rows * cols / kMxfp4Group + misalign_elements);
      for (uint8_t& b : codes_) b = static_cast<uint8_t>(rng());
      for (uint8_t& s : scales_) s = static_cast<uint8_t>(120 + rng() % 11);
      matrix_ = WeightMatrix{codes_.data() + misalign_elements, type, rows, cols,
                             scales_.data() + misalign_elements};
      return;
    }
    const size_t element = type == WeightType::kBf16 ? 2 : 4;
    storage_.resize((rows * cols + misalign_elements) * element + 64);
    // Start at a 64-byte boundary, then step off it.
    uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    char* start = storage_.data() + ((64 - base % 64) % 64) + misalign_elements * element;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float value = dist(rng);
      if (type == WeightType::kBf16) {
        const uint16_t bits = FloatToBf16(value);
        std::memcpy(start + 2 * i, &bits, 2);
      } else {
        std::memcpy(start + 4 * i, &value, 4);
      }
    }
    matrix_ = WeightMatrix{start, type, rows, cols};
  }

  const WeightMatrix& matrix() const { return matrix_; }

 private:
  std::vector<char> storage_;
  std::vector<uint8_t> codes_, scales_;
  WeightMatrix matrix_;
};

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

struct Case {
  int64_t tokens, rows, cols;
  int64_t x_pad = 0, y_pad = 0;  // extra elements per row beyond cols / rows
  bool accumulate = false;
  int misalign = 0;  // weight pointer offset in elements from a 64-byte boundary
};

std::string Describe(const Case& c, WeightType type, MatMulKernel kernel) {
  return "tokens=" + std::to_string(c.tokens) + " rows=" + std::to_string(c.rows) +
         " cols=" + std::to_string(c.cols) + " x_pad=" + std::to_string(c.x_pad) +
         " y_pad=" + std::to_string(c.y_pad) + " accumulate=" + std::to_string(c.accumulate) +
         " misalign=" + std::to_string(c.misalign) +
         " type=" + std::to_string(static_cast<int>(type)) +
         " kernel=" + std::to_string(static_cast<int>(kernel));
}

// Runs one case and compares every output with a double-precision loop over WeightMatrix::At.
void CheckCase(const Case& c, WeightType type, MatMulKernel kernel, uint32_t seed) {
  SCOPED_TRACE(Describe(c, type, kernel));
  TestWeights weights(type, c.rows, c.cols, c.misalign, seed);
  const WeightMatrix& w = weights.matrix();
  const int64_t x_stride = c.cols + c.x_pad, y_stride = c.rows + c.y_pad;
  const std::vector<float> x = RandomVector(c.tokens * x_stride, seed + 1);
  // Gaps in y hold NaN sentinels that must survive; the written part starts random.
  std::vector<float> y = RandomVector(c.tokens * y_stride, seed + 2);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t r = c.rows; r < y_stride; ++r) {
      y[t * y_stride + r] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const std::vector<float> y_before = y;

  internal::MatMulWith(kernel, w, x.data(), x_stride, c.tokens, y.data(), y_stride, c.accumulate);

  int failures = 0;
  for (int64_t t = 0; t < c.tokens && failures < 5; ++t) {
    for (int64_t r = 0; r < y_stride && failures < 5; ++r) {
      const float got = y[t * y_stride + r];
      if (r >= c.rows) {
        if (!std::isnan(got)) {
          ADD_FAILURE() << "wrote past the row end at token " << t << " row " << r;
          ++failures;
        }
        continue;
      }
      double expected = c.accumulate ? y_before[t * y_stride + r] : 0.0;
      double magnitude = std::abs(expected);
      for (int64_t k = 0; k < c.cols; ++k) {
        const double product = static_cast<double>(w.At(r, k)) * x[t * x_stride + k];
        expected += product;
        magnitude += std::abs(product);
      }
      // fp32 accumulation: a few ulps of the sum of magnitudes.
      const double tolerance = 1e-5 * magnitude + 1e-30;
      if (!(std::abs(got - expected) <= tolerance)) {
        ADD_FAILURE() << "token " << t << " row " << r << ": got " << got << ", expected "
                      << expected << " (tolerance " << tolerance << ")";
        ++failures;
      }
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Odd and aligned widths around the vector (16), tile (48 rows, 8 tokens) and block (128
  // inputs) sizes, for every token count the kernels special-case.
  const int64_t cols_list[] = {1, 7, 16, 17, 31, 33, 127, 128, 129, 300};
  const int64_t rows_list[] = {1, 5, 17, 47, 48, 49, 97};
  int i = 0;
  for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17}) {
    for (int64_t cols : cols_list) {
      const int64_t rows = rows_list[i++ % 7];
      cases.push_back({tokens, rows, cols});
    }
  }
  // Larger shapes: several input blocks, partial token blocks past 256, threading.
  cases.push_back({64, 96, 512});
  cases.push_back({63, 100, 385});
  cases.push_back({257, 50, 200});
  cases.push_back({300, 49, 130});
  cases.push_back({1, 400, 1100});
  cases.push_back({8, 200, 700});
  cases.push_back({33, 300, 260});
  // Strides, accumulation and misaligned weights.
  for (int misalign : {1, 3}) {
    cases.push_back({1, 37, 45, 3, 5, true, misalign});
    cases.push_back({6, 50, 129, 1, 16, false, misalign});
    cases.push_back({20, 97, 161, 16, 1, true, misalign});
    cases.push_back({70, 48, 64, 7, 9, true, misalign});
  }
  return cases;
}

class MatMulKernelTest : public ::testing::TestWithParam<MatMulKernel> {
 protected:
  void SetUp() override {
    const KernelIsa isa = internal::IsaOf(GetParam());
    if (!CpuSupports(isa)) GTEST_SKIP() << "this CPU does not run " << KernelIsaName(isa);
    // Exact activations whatever K3SERVE_MXFP4_ACTIVATIONS says (int8: MatMulMxfp4Int8Test).
    SetMxfp4Activations(Mxfp4Activations::kFp32);
  }
};

TEST_P(MatMulKernelTest, MatchesDoublePrecisionLoop) {
  uint32_t seed = 1;
  for (const Case& c : Cases()) {
    for (WeightType type : {WeightType::kBf16, WeightType::kF32}) {
      CheckCase(c, type, GetParam(), seed += 7);
      if (HasFailure()) return;
    }
    // MXFP4 needs whole groups of 32 inputs.
    Case mxfp4 = c;
    mxfp4.cols = (c.cols + kMxfp4Group - 1) / kMxfp4Group * kMxfp4Group;
    CheckCase(mxfp4, WeightType::kMxfp4, GetParam(), seed += 7);
    if (HasFailure()) return;
  }
}

// The kernels decode every code and scale exactly: one-hot activations read back single weights,
// including the subnormal products of scale byte 0 (2^-127) and the largest scale whose products
// all fit fp32 (252: 6 * 2^125; loaders reject 253 and up).
TEST_P(MatMulKernelTest, Mxfp4DecodesExactly) {
  const int64_t rows = 50, cols = 64;
  std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / kMxfp4Group);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>((i * 89) % 253);
  scales[0] = 0;
  scales[1] = kMxfp4MaxScale;
  const WeightMatrix w{codes.data(), WeightType::kMxfp4, rows, cols, scales.data()};
  for (int64_t tokens : {1, 20}) {
    std::vector<float> x(tokens * cols, 0.0f), y(tokens * rows);
    for (int64_t t = 0; t < tokens; ++t) x[t * cols + (t * 7) % cols] = 1.0f;
    internal::MatMulWith(GetParam(), w, x.data(), cols, tokens, y.data(), rows, false);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = (t * 7) % cols;
        const uint8_t code = (codes[(r * cols + c) / 2] >> (4 * (c % 2))) & 0xf;
        const double expected =
            kE2m1Values[code] * std::ldexp(1.0, scales[r * 2 + c / kMxfp4Group] - 127);
        ASSERT_EQ(y[t * rows + r], expected) << "token " << t << " row " << r;
      }
    }
  }
}

// Activations keep all their fp32 bits: with a single input the product must be exact.
TEST_P(MatMulKernelTest, DoesNotRoundActivations) {
  for (int64_t tokens : {1, 8, 20}) {
    const int64_t rows = 3;
    std::vector<uint16_t> bits(rows, FloatToBf16(1.5f));
    WeightMatrix w{bits.data(), WeightType::kBf16, rows, 1};
    std::vector<float> x(tokens), y(tokens * rows);
    for (int64_t t = 0; t < tokens; ++t) x[t] = 1.0f + std::ldexp(1.0f, -20) * (t + 1);
    internal::MatMulWith(GetParam(), w, x.data(), 1, tokens, y.data(), rows, false);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(y[t * rows + r], 1.5f * x[t]) << t;
    }
  }
}

TEST_P(MatMulKernelTest, NoInputsGivesZeroOrLeavesAccumulator) {
  const uint16_t unused = 0;  // a matrix with no inputs reads no weights
  WeightMatrix w{&unused, WeightType::kBf16, 4, 0};
  std::vector<float> y(8, 2.0f);
  internal::MatMulWith(GetParam(), w, nullptr, 0, 2, y.data(), 4, true);
  for (float v : y) EXPECT_EQ(v, 2.0f);
  internal::MatMulWith(GetParam(), w, nullptr, 0, 2, y.data(), 4, false);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Kernels, MatMulKernelTest,
                         ::testing::Values(MatMulKernel::kAuto, MatMulKernel::kPortable,
                                           MatMulKernel::kAvx512Rows, MatMulKernel::kAvx512Tiles,
                                           MatMulKernel::kAvx2Rows, MatMulKernel::kAvx2Tiles),
                         [](const ::testing::TestParamInfo<MatMulKernel>& info) {
                           switch (info.param) {
                             case MatMulKernel::kAuto: return std::string("Auto");
                             case MatMulKernel::kPortable: return std::string("Portable");
                             case MatMulKernel::kAvx512Rows: return std::string("Avx512Rows");
                             case MatMulKernel::kAvx512Tiles: return std::string("Avx512Tiles");
                             case MatMulKernel::kAvx2Rows: return std::string("Avx2Rows");
                             case MatMulKernel::kAvx2Tiles: return std::string("Avx2Tiles");
                           }
                           return std::string("Unknown");
                         });

TEST(MatMulTest, DensePublicOverload) {
  TestWeights weights(WeightType::kBf16, 10, 20, 0, 99);
  const std::vector<float> x = RandomVector(3 * 20, 5);
  std::vector<float> y(3 * 10), y_strided(3 * 10);
  MatMul(weights.matrix(), x.data(), 3, y.data());
  MatMul(weights.matrix(), x.data(), 20, 3, y_strided.data(), 10, false);
  EXPECT_EQ(y, y_strided);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t r = 0; r < 10; ++r) {
      double expected = 0;
      for (int64_t k = 0; k < 20; ++k) expected += weights.matrix().At(r, k) * x[t * 20 + k];
      EXPECT_NEAR(y[t * 10 + r], expected, 1e-5);
    }
  }
}

// A batch gives every task exactly what MatMul gives it alone: the same kernel computes each row
// whichever thread takes it. Mixed types, sizes that split across threads and rows that are not a
// multiple of the row blocks, strides and accumulation; 13 tokens take the one-by-one path.
// On every family this CPU runs, against MatMul through that family's kernels.
class MatMulBatchTest : public ::testing::TestWithParam<KernelIsa> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) {
      GTEST_SKIP() << "this CPU does not run " << KernelIsaName(GetParam());
    }
    SetMxfp4Activations(Mxfp4Activations::kFp32);
  }
};

TEST_P(MatMulBatchTest, EqualsMatMulTaskByTask) {
  const KernelIsa isa = GetParam();
  const MatMulKernel rows_kernel = isa == KernelIsa::kAvx512 ? MatMulKernel::kAvx512Rows
                                   : isa == KernelIsa::kAvx2 ? MatMulKernel::kAvx2Rows
                                                             : MatMulKernel::kPortable;
  const MatMulKernel tiles_kernel = isa == KernelIsa::kAvx512 ? MatMulKernel::kAvx512Tiles
                                    : isa == KernelIsa::kAvx2 ? MatMulKernel::kAvx2Tiles
                                                              : MatMulKernel::kPortable;
  struct Spec {
    WeightType type;
    int64_t rows, cols, x_pad, y_pad;
    bool accumulate;
  };
  const Spec specs[] = {{WeightType::kBf16, 1024, 512, 0, 0, false},
                        {WeightType::kMxfp4, 301, 256, 3, 1, true},
                        {WeightType::kF32, 37, 129, 0, 5, false},
                        {WeightType::kBf16, 8, 1024, 16, 0, true},
                        {WeightType::kBf16, 1, 33, 0, 0, false}};
  for (int64_t tokens : {1, 2, 3, 5, 12, 13}) {
    SCOPED_TRACE("tokens=" + std::to_string(tokens));
    std::vector<TestWeights> weights;
    std::vector<std::vector<float>> xs, batch_ys, single_ys;
    std::vector<MatMulTask> tasks;
    uint32_t seed = 100;
    for (const Spec& s : specs) {
      weights.emplace_back(s.type, s.rows, s.cols, 0, seed++);
      xs.push_back(RandomVector(tokens * (s.cols + s.x_pad), seed++));
      batch_ys.push_back(RandomVector(tokens * (s.rows + s.y_pad), seed++));
    }
    single_ys = batch_ys;
    for (size_t i = 0; i < weights.size(); ++i) {
      const Spec& s = specs[i];
      tasks.push_back(MatMulTask{&weights[i].matrix(), xs[i].data(), s.cols + s.x_pad,
                                 batch_ys[i].data(), s.rows + s.y_pad, s.accumulate});
      // The batch's choice of kernel: rows up to 12 tokens (MXFP4: 32), else tiles; batch
      // invariant (base/batch_invariance.h, the default), always rows.
      const int64_t rows_max = s.type == WeightType::kMxfp4 ? 32 : 12;
      const bool rows = BatchInvariant() || tokens <= rows_max;
      internal::MatMulWith(rows ? rows_kernel : tiles_kernel, weights[i].matrix(),
                           xs[i].data(), s.cols + s.x_pad, tokens, single_ys[i].data(),
                           s.rows + s.y_pad, s.accumulate);
    }
    internal::MatMulBatchOn(isa, tasks.data(), static_cast<int>(tasks.size()), tokens);
    for (size_t i = 0; i < tasks.size(); ++i) {
      SCOPED_TRACE("task " + std::to_string(i));
      ASSERT_EQ(batch_ys[i].size(), single_ys[i].size());
      EXPECT_EQ(0, std::memcmp(batch_ys[i].data(), single_ys[i].data(),
                               batch_ys[i].size() * sizeof(float)));
    }
  }
}

// Batch invariance (base/batch_invariance.h): each token's output row is bitwise the same
// whatever else shares the call: MatMul and MatMulBatch over 1 to 70 tokens (one kernel call, row
// blocks and token groups of every size, the tiled kernel's range when invariance is off) give
// each token the row it gets alone, for every weight type and family, with and without
// accumulation.
TEST_P(MatMulBatchTest, EachTokensRowDoesNotDependOnTheOthers) {
  ASSERT_TRUE(BatchInvariant());
  const KernelIsa isa = GetParam();
  if (!CpuSupports(isa)) GTEST_SKIP() << KernelIsaName(isa) << " not on this CPU";
  const MatMulKernel kernel = isa == KernelIsa::kAvx512 ? MatMulKernel::kAvx512Rows
                              : isa == KernelIsa::kAvx2 ? MatMulKernel::kAvx2Rows
                                                        : MatMulKernel::kPortable;
  uint32_t seed = 900;
  for (WeightType type : {WeightType::kBf16, WeightType::kF32, WeightType::kMxfp4}) {
    for (int64_t cols : {64, 200, 1024}) {
      if (type == WeightType::kMxfp4 && cols % kMxfp4Group != 0) continue;
      const int64_t rows = 77;
      TestWeights weights(type, rows, cols, 0, seed++);
      const int64_t tokens = 70;
      const std::vector<float> x = RandomVector(tokens * cols, seed++);
      const std::vector<float> y0 = RandomVector(tokens * rows, seed++);
      for (bool accumulate : {false, true}) {
        // Alone: one token per call.
        std::vector<float> alone = y0;
        for (int64_t t = 0; t < tokens; ++t) {
          const MatMulTask task{&weights.matrix(), x.data() + t * cols, cols,
                                alone.data() + t * rows, rows, accumulate};
          internal::MatMulBatchOn(isa, &task, 1, 1);
        }
        for (int64_t n : {2, 3, 5, 8, 12, 13, 17, 33, 70}) {
          SCOPED_TRACE(std::to_string(cols) + " inputs, " + std::to_string(n) + " tokens, type " +
                       std::to_string(static_cast<int>(type)) + (accumulate ? ", +=" : ""));
          std::vector<float> together = y0;
          if (n % 2 == 0) {  // through MatMulBatch's choice, else the family's kernel
            const MatMulTask task{&weights.matrix(), x.data(), cols, together.data(), rows,
                                  accumulate};
            internal::MatMulBatchOn(isa, &task, 1, n);
          } else {
            internal::MatMulWith(kernel, weights.matrix(), x.data(), cols, n, together.data(),
                                 rows, accumulate);
          }
          EXPECT_EQ(0, std::memcmp(together.data(), alone.data(), n * rows * sizeof(float)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MatMulBatchTest,
                         ::testing::Values(KernelIsa::kPortable, KernelIsa::kAvx2,
                                           KernelIsa::kAvx512),
                         [](const ::testing::TestParamInfo<KernelIsa>& info) {
                           return std::string(KernelIsaName(info.param));
                         });

// Sets the MXFP4 activation mode for one test and restores the default after it.
class ScopedMxfp4Activations {
 public:
  explicit ScopedMxfp4Activations(Mxfp4Activations mode) { SetMxfp4Activations(mode); }
  ~ScopedMxfp4Activations() { SetMxfp4Activations(Mxfp4Activations::kFp32); }
};

// 8-bit activations against the fp64 product of the unrounded ones, within the bound the rounding
// allows: each input moves by at most a_g / 254 (a_g: its group's largest magnitude), so a row's
// sum by at most sum_g (a_g / 254) sum_{i in g} |w_i|; the fp32 steps after the exact integer
// group sums add a few ulps of sum_i |w_i| (|x_i| + a_g / 254). Every token count (past the 32
// where fp32 activations change kernels), accumulation, odd group counts, and the batch entry.
TEST(MatMulMxfp4Int8Test, WithinTheRoundingBound) {
  if (!CpuSupports(KernelIsa::kAvx2)) GTEST_SKIP() << "the int8 kernel needs AVX2";
  ScopedMxfp4Activations int8(Mxfp4Activations::kInt8);
  struct Shape {
    int64_t tokens, rows, cols;
    bool accumulate;
  };
  uint32_t seed = 500;
  double worst_ratio = 0;
  for (const Shape& s : {Shape{1, 37, 32, false}, Shape{1, 97, 96, true}, Shape{2, 50, 64, false},
                         Shape{3, 17, 160, true}, Shape{4, 8, 3584, false},
                         Shape{5, 49, 288, false}, Shape{13, 300, 256, true},
                         Shape{40, 33, 96, false}, Shape{1, 3072, 3584, false}}) {
    SCOPED_TRACE("tokens=" + std::to_string(s.tokens) + " rows=" + std::to_string(s.rows) +
                 " cols=" + std::to_string(s.cols));
    TestWeights weights(WeightType::kMxfp4, s.rows, s.cols, 0, seed++);
    const WeightMatrix& w = weights.matrix();
    const std::vector<float> x = RandomVector(s.tokens * s.cols, seed++);
    std::vector<float> y = RandomVector(s.tokens * s.rows, seed++);
    const std::vector<float> y_before = y;
    MatMul(w, x.data(), s.cols, s.tokens, y.data(), s.rows, s.accumulate);
    int failures = 0;
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t r = 0; r < s.rows && failures < 5; ++r) {
        double exact = s.accumulate ? y_before[t * s.rows + r] : 0.0;
        double rounding = 0, magnitude = std::abs(exact);
        for (int64_t g = 0; g < s.cols; g += kMxfp4Group) {
          double amax = 0;
          for (int64_t k = g; k < g + kMxfp4Group; ++k) {
            amax = std::max(amax, std::abs(static_cast<double>(x[t * s.cols + k])));
          }
          for (int64_t k = g; k < g + kMxfp4Group; ++k) {
            const double wk = w.At(r, k), xk = x[t * s.cols + k];
            exact += wk * xk;
            rounding += std::abs(wk) * amax / 254;
            magnitude += std::abs(wk) * (std::abs(xk) + amax / 254);
          }
        }
        const double error = std::abs(y[t * s.rows + r] - exact);
        const double bound = rounding + 1e-5 * magnitude;
        worst_ratio = std::max(worst_ratio, error / bound);
        if (!(error <= bound)) {
          ADD_FAILURE() << "token " << t << " row " << r << ": got " << y[t * s.rows + r]
                        << ", exact " << exact << ", bound " << bound;
          ++failures;
        }
      }
    }
  }
  std::cerr << "int8 activations: worst error / bound " << worst_ratio << "\n";
}

// With 8-bit activations a token's sums do not depend on the other tokens of the call: each token
// alone gives bit for bit what it gives among 40 (past the fp32 mode's switch to tiles at 32).
TEST(MatMulMxfp4Int8Test, EachTokenIndependentOfTheCall) {
  if (!CpuSupports(KernelIsa::kAvx2)) GTEST_SKIP() << "the int8 kernel needs AVX2";
  ScopedMxfp4Activations int8(Mxfp4Activations::kInt8);
  const int64_t tokens = 40, rows = 203, cols = 288;
  TestWeights weights(WeightType::kMxfp4, rows, cols, 0, 77);
  const std::vector<float> x = RandomVector(tokens * cols, 78);
  std::vector<float> all(tokens * rows), one(rows);
  MatMul(weights.matrix(), x.data(), cols, tokens, all.data(), rows, false);
  for (int64_t t = 0; t < tokens; ++t) {
    MatMul(weights.matrix(), x.data() + t * cols, cols, 1, one.data(), rows, false);
    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * rows, rows * sizeof(float)))
        << "token " << t;
  }
}

// A non-finite activation makes its token's outputs NaN, as with fp32 activations, instead of a
// quietly wrong number.
TEST(MatMulMxfp4Int8Test, NonFiniteActivationGivesNaN) {
  if (!CpuSupports(KernelIsa::kAvx2)) GTEST_SKIP() << "the int8 kernel needs AVX2";
  ScopedMxfp4Activations int8(Mxfp4Activations::kInt8);
  const int64_t rows = 16, cols = 96;
  TestWeights weights(WeightType::kMxfp4, rows, cols, 0, 9);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = RandomVector(2 * cols, 10), y(2 * rows);
    x[cols + 40] = bad;
    MatMul(weights.matrix(), x.data(), cols, 2, y.data(), rows, false);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_TRUE(std::isfinite(y[r])) << r;
      EXPECT_TRUE(std::isnan(y[rows + r])) << r;
    }
  }
}

TEST(WeightMatrixTest, AtReadsEitherType) {
  const uint16_t bf16[] = {FloatToBf16(1.0f), FloatToBf16(-2.5f), FloatToBf16(3.0f),
                           FloatToBf16(0.125f)};
  WeightMatrix a{bf16, WeightType::kBf16, 2, 2};
  EXPECT_EQ(a.At(0, 1), -2.5f);
  EXPECT_EQ(a.At(1, 0), 3.0f);
  const float f32[] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  WeightMatrix b{f32, WeightType::kF32, 2, 3};
  EXPECT_EQ(b.At(1, 2), 6.0f);
  EXPECT_EQ(b.At(0, 1), 2.0f);
}

TEST(WeightMatrixTest, RowSliceViewsRows) {
  const float f32[] = {1, 2, 3, 4, 5, 6, 7, 8};
  WeightMatrix w{f32, WeightType::kF32, 4, 2};
  WeightMatrix slice = w.RowSlice(1, 2);
  EXPECT_EQ(slice.rows, 2);
  EXPECT_EQ(slice.cols, 2);
  EXPECT_EQ(slice.At(0, 0), 3.0f);
  EXPECT_EQ(slice.At(1, 1), 6.0f);
  const uint16_t bf16[] = {0x3f80, 0x4000, 0x4040, 0x4080};  // 1, 2, 3, 4
  WeightMatrix v{bf16, WeightType::kBf16, 4, 1};
  EXPECT_EQ(v.RowSlice(3, 1).At(0, 0), 4.0f);
  EXPECT_TRUE(v.RowSlice(4, 0).rows == 0);
}

TEST(WeightMatrixTest, Mxfp4AtAndRowSlice) {
  // Row 0: inputs 0, 1 are codes 0x1 (0.5), 0xa (-1), scale 2^1; row 1: codes 0x7 (6), 0xf (-6)
  // at scale 2^-127 (byte 0): element 2i is the low nibble.
  std::vector<uint8_t> codes(2 * 16, 0), scales = {128, 0};
  codes[0] = 0xa1;
  codes[16] = 0xf7;
  const WeightMatrix w{codes.data(), WeightType::kMxfp4, 2, 32, scales.data()};
  EXPECT_EQ(w.At(0, 0), 1.0f);
  EXPECT_EQ(w.At(0, 1), -2.0f);
  EXPECT_EQ(w.At(0, 2), 0.0f);
  EXPECT_EQ(w.At(1, 0), std::ldexp(6.0f, -127));
  EXPECT_EQ(w.At(1, 1), std::ldexp(-6.0f, -127));
  const WeightMatrix slice = w.RowSlice(1, 1);
  EXPECT_EQ(slice.rows, 1);
  EXPECT_EQ(slice.At(0, 0), std::ldexp(6.0f, -127));
}

TEST(WeightMatrixDeathTest, RejectsOutOfRangeAccess) {
  const float f32[] = {1, 2, 3, 4};
  WeightMatrix w{f32, WeightType::kF32, 2, 2};
  EXPECT_DEATH(w.At(2, 0), "outside");
  EXPECT_DEATH(w.RowSlice(1, 2), "outside");
}

}  // namespace
}  // namespace k3
