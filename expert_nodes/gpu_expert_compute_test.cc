// GpuExpertCompute against two references, on random MXFP4 experts (every code, scales around
// the value that gives the gate unit-scale sums) at k3-tiny's expert shape (d 128, f 64) and at
// K3's (k3-slice, spec §12.7: d 3584, f 3072), 1 to 64 rows per expert:
//  - RunExperts, the CPU computation (fp32 rows). The GPU rounds the rows and the hidden vector
//    to bf16 (round to nearest even: each element off by at most 2^-9 of itself). Through two
//    products with random weights, that gives each output row a relative L2 error about the RMS
//    of those per-element errors (2^-9/sqrt(3) each, two roundings: about 1.6e-3); rows where the
//    sum cancels can be worse, so the bound is 1e-2.
//  - fp64 sums of the same bf16-rounded inputs, the GLU in fp32 and its output rounded to bf16 as
//    the kernel does: only the fp32 accumulation order and an occasional hidden value rounding
//    the other way (one bf16 ulp, 2^-8 of one element) differ, so the bound is 2e-3.
// RunOnDevice (rows, routing and answer in device memory, grouped on the device) is held to the
// first bound against RunExperts on the same assignments. Without a GPU each case reports itself
// skipped ("no GPU").
#include "expert_nodes/gpu_expert_compute.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "expert_nodes/expert_compute.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/mxfp4.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

constexpr double kCpuBound = 1e-2;
constexpr double kEmulatedBound = 2e-3;

struct Matrix {
  std::vector<uint8_t> codes, scales;
  WeightMatrix view;
};

Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  // RMS of an E2M1 code is about 2.9: scale so that a row's sum over N(0,1) inputs is about 2.
  const int center = 127 - static_cast<int>(std::lround(std::log2(std::sqrt(cols) * 2.9 / 2)));
  Matrix m;
  m.codes.resize(rows * cols / 2);
  m.scales.resize(rows * cols / 32);
  for (uint8_t& c : m.codes) c = rng() & 0xff;
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(center - 1 + static_cast<int>(rng() % 3));
  m.view = WeightMatrix{m.codes.data(), WeightType::kMxfp4, rows, cols, m.scales.data()};
  return m;
}

struct Experts {
  std::vector<Matrix> matrices;  // 3 per expert: gate, up, down
  std::vector<GatedMlpWeights> weights;
};

Experts RandomExperts(int count, int64_t width, int64_t hidden, uint32_t seed) {
  std::mt19937 rng(seed);
  Experts e;
  e.matrices.reserve(3 * count);
  for (int i = 0; i < count; ++i) {
    e.matrices.push_back(RandomMatrix(hidden, width, rng));
    e.matrices.push_back(RandomMatrix(hidden, width, rng));
    e.matrices.push_back(RandomMatrix(width, hidden, rng));
  }
  for (int i = 0; i < count; ++i) {
    e.weights.push_back(GatedMlpWeights{e.matrices[3 * i].view, e.matrices[3 * i + 1].view,
                                        e.matrices[3 * i + 2].view});
  }
  return e;
}

// Σ_c W[r, c] x[c] in fp64, W decoded by kernels/mxfp4.h's table and scales.
double RowDot(const WeightMatrix& w, int64_t r, const std::vector<double>& x) {
  const uint8_t* codes = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);
  const uint8_t* scales = w.scales + r * (w.cols / kMxfp4Group);
  double sum = 0;
  for (int64_t g = 0; g < w.cols / kMxfp4Group; ++g) {
    double part = 0;
    for (int64_t c = g * kMxfp4Group; c < (g + 1) * kMxfp4Group; c += 2) {
      const uint8_t byte = codes[c / 2];
      part += double{kE2m1Values[byte & 0xf]} * x[c] + double{kE2m1Values[byte >> 4]} * x[c + 1];
    }
    sum += part * double{E8m0Scale(scales[g])};
  }
  return sum;
}

double RoundBf16(double v) { return Bf16ToFloat(FloatToBf16(static_cast<float>(v))); }

// The GPU's arithmetic in fp64: row `row` of the answer.
std::vector<double> EmulatedRow(const Experts& e, const GluParams& params, const float* z,
                                int64_t width, const std::vector<ExpertAssignment>& assignments,
                                int32_t row) {
  std::vector<double> x(width), out(width, 0.0);
  for (int64_t c = 0; c < width; ++c) x[c] = RoundBf16(z[row * width + c]);
  for (const ExpertAssignment& a : assignments) {
    if (a.row != row) continue;
    const GatedMlpWeights& w = e.weights[a.expert];
    std::vector<double> h(w.gate.rows);
    for (int64_t f = 0; f < w.gate.rows; ++f) {
      h[f] = RoundBf16(GluCombine(params, static_cast<float>(RowDot(w.gate, f, x)),
                                  static_cast<float>(RowDot(w.up, f, x))));
    }
    for (int64_t d = 0; d < width; ++d) out[d] += a.weight * RowDot(w.down, d, h);
  }
  return out;
}

template <typename T>
double RelativeError(const float* got, const T* want, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (got[i] - double{want[i]}) * (got[i] - double{want[i]});
    norm += double{want[i]} * want[i];
  }
  return norm == 0 ? (diff == 0 ? 0 : std::numeric_limits<double>::infinity())
                   : std::sqrt(diff / norm);
}

// Each of `experts` experts takes `per_expert` distinct random rows of `rows`, with random
// routing weights; rows may have several experts or none.
std::vector<ExpertAssignment> RandomAssignments(int experts, int per_expert, int rows,
                                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ExpertAssignment> assignments;
  std::vector<int32_t> all(rows);
  for (int32_t r = 0; r < rows; ++r) all[r] = r;
  for (int32_t e = experts - 1; e >= 0; --e) {  // out of order: Run must group them
    std::shuffle(all.begin(), all.end(), rng);
    for (int i = 0; i < per_expert; ++i) {
      assignments.push_back({all[i], e, 0.05f + (rng() % 1000) / 1000.f});
    }
  }
  return assignments;
}

void CheckShape(int experts, int64_t width, int64_t hidden, int per_expert, int rows,
                int emulated_rows) {
  SCOPED_TRACE(testing::Message() << "d " << width << " f " << hidden << ", " << experts
                                  << " experts x " << per_expert << " rows");
  const Experts e = RandomExperts(experts, width, hidden, 7 * per_expert + width);
  const GluParams params{true, 4.0f, 25.0f};
  absl::StatusOr<std::unique_ptr<GpuExpertCompute>> gpu =
      GpuExpertCompute::Create(e.weights, params, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->weight_bytes(), experts * 3 * (width * hidden / 2 + width * hidden / 32));
  std::mt19937 rng(per_expert);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> z(rows * width);
  for (float& v : z) v = normal(rng);
  const std::vector<ExpertAssignment> assignments =
      RandomAssignments(experts, per_expert, rows, per_expert + 1);

  std::vector<float> got(rows * width, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE((*gpu)->Run(z.data(), rows, width, assignments, got.data()).ok());
  std::vector<float> cpu(rows * width);
  ExpertScratch scratch;
  ASSERT_TRUE(
      RunExperts(e.weights, params, z.data(), rows, width, assignments, cpu.data(), &scratch).ok());
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double error = RelativeError(got.data() + r * width, cpu.data() + r * width, width);
    EXPECT_LE(error, kCpuBound) << "row " << r;
    worst = std::max(worst, error);
  }
  double worst_emulated = 0;
  for (int32_t r = 0; r < std::min(rows, emulated_rows); ++r) {
    const std::vector<double> want = EmulatedRow(e, params, z.data(), width, assignments, r);
    const double error = RelativeError(got.data() + r * width, want.data(), width);
    EXPECT_LE(error, kEmulatedBound) << "row " << r;
    worst_emulated = std::max(worst_emulated, error);
  }
  printf("d %lld f %lld, %d experts x %d rows: worst row vs CPU %.3g, vs fp64 emulation %.3g\n",
         static_cast<long long>(width), static_cast<long long>(hidden), experts, per_expert, worst,
         worst_emulated);
}

TEST(GpuExpertComputeTest, K3TinyExpertsMatchTheCpu) {
  REQUIRE_GPU();
  for (int per_expert : {1, 4, 12, 16, 40}) CheckShape(32, 128, 64, per_expert, 64, 64);
}

TEST(GpuExpertComputeTest, K3ExpertsMatchTheCpu) {
  REQUIRE_GPU();
  for (int per_expert : {1, 4, 16, 64}) CheckShape(16, 3584, 3072, per_expert, 64, 3);
}

// RunOnDevice with rows, routing and output in device memory: every row picks top_k distinct
// random experts, as the GPU gate does; the answer is RunExperts' on the same assignments.
void CheckDeviceRouting(int experts, int64_t width, int64_t hidden, int rows, int top_k) {
  SCOPED_TRACE(testing::Message() << "d " << width << ", " << rows << " rows x top " << top_k
                                  << " of " << experts);
  const Experts e = RandomExperts(experts, width, hidden, 31 * rows + top_k);
  const GluParams params{true, 4.0f, 25.0f};
  auto gpu = GpuExpertCompute::Create(e.weights, params, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937 rng(rows + 100 * top_k);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> z(rows * width);
  for (float& v : z) v = normal(rng);
  std::vector<int32_t> ids, order(experts);
  std::vector<float> weights;
  std::vector<ExpertAssignment> assignments;
  for (int32_t r = 0; r < rows; ++r) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < top_k; ++k) {
      ids.push_back(order[k]);
      weights.push_back(0.05f + (rng() % 1000) / 1000.f);
      assignments.push_back({r, order[k], weights.back()});
    }
  }
  float *z_dev = nullptr, *weights_dev = nullptr, *out_dev = nullptr;
  int32_t* ids_dev = nullptr;
  ASSERT_EQ(cudaMalloc(&z_dev, z.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out_dev, z.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&weights_dev, weights.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ids_dev, ids.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(z_dev, z.data(), z.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(weights_dev, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ids_dev, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> got(z.size(), std::numeric_limits<float>::quiet_NaN());
  for (int call = 0; call < 2; ++call) {  // the second call reuses the scratch
    ASSERT_EQ(cudaMemset(out_dev, 0xff, z.size() * 4), cudaSuccess);  // NaNs: overwritten?
    const absl::Status status = (*gpu)->RunOnDevice(z_dev, rows, width, ids_dev, weights_dev, top_k,
                                                    out_dev, /*stream=*/nullptr);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaMemcpy(got.data(), out_dev, z.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  for (void* p : {static_cast<void*>(z_dev), static_cast<void*>(out_dev),
                  static_cast<void*>(weights_dev), static_cast<void*>(ids_dev)}) {
    cudaFree(p);
  }
  std::vector<float> cpu(z.size());
  ExpertScratch scratch;
  ASSERT_TRUE(
      RunExperts(e.weights, params, z.data(), rows, width, assignments, cpu.data(), &scratch).ok());
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_LE(RelativeError(got.data() + r * width, cpu.data() + r * width, width), kCpuBound)
        << "row " << r;
  }
}

TEST(GpuExpertComputeTest, DeviceRoutingMatchesTheCpu) {
  REQUIRE_GPU();
  // k3-tiny's experts at chunk sizes 8, 16 and 32 (from the row count), then K3's.
  for (int rows : {1, 5, 12, 40}) CheckDeviceRouting(32, 128, 64, rows, 4);
  for (int rows : {1, 8}) CheckDeviceRouting(16, 3584, 3072, rows, 16);
}

TEST(GpuExpertComputeTest, DeviceRoutingNeedsEveryExpert) {
  REQUIRE_GPU();
  Experts e = RandomExperts(2, 128, 64, 17);
  std::vector<GatedMlpWeights> hosted = e.weights;
  hosted[1] = GatedMlpWeights{};
  auto gpu = GpuExpertCompute::Create(hosted, GluParams{}, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const absl::Status status =
      (*gpu)->RunOnDevice(nullptr, 1, 128, nullptr, nullptr, 1, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("every expert"), std::string::npos) << status;
}

// The combine sums each row's experts in a fixed order: the same call gives the same bits (the
// CUDA-graph comparison of gpu_engine_test relies on it).
TEST(GpuExpertComputeTest, RepeatedCallsGiveTheSameBits) {
  REQUIRE_GPU();
  const Experts e = RandomExperts(8, 128, 64, 11);
  auto gpu = GpuExpertCompute::Create(e.weights, GluParams{}, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> z(8 * 128, 0.5f);
  const auto assignments = RandomAssignments(8, 3, 8, 12);
  std::vector<float> first(z.size()), again(z.size());
  ASSERT_TRUE((*gpu)->Run(z.data(), 8, 128, assignments, first.data()).ok());
  ASSERT_TRUE((*gpu)->Run(z.data(), 8, 128, assignments, again.data()).ok());
  for (size_t i = 0; i < z.size(); ++i) {
    ASSERT_EQ(std::memcmp(&again[i], &first[i], sizeof(float)), 0) << "element " << i;
  }
}

TEST(GpuExpertComputeTest, BadInputFailsWithItsReason) {
  REQUIRE_GPU();
  Experts e = RandomExperts(2, 128, 64, 13);
  std::vector<GatedMlpWeights> hosted = e.weights;
  hosted[1] = GatedMlpWeights{};
  auto gpu = GpuExpertCompute::Create(hosted, GluParams{}, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> z(2 * 128, 1.f), out(2 * 128);
  absl::Status row = (*gpu)->Run(z.data(), 2, 128, {{2, 0, 1.f}}, out.data());
  EXPECT_EQ(row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(row.message().find("row 2 outside [0, 2)"), std::string::npos) << row;
  absl::Status expert = (*gpu)->Run(z.data(), 2, 128, {{0, 1, 1.f}}, out.data());
  EXPECT_EQ(expert.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(expert.message().find("expert 1 is not hosted"), std::string::npos) << expert;

  std::vector<GatedMlpWeights> bf16 = e.weights;
  bf16[0].up.type = WeightType::kBf16;
  auto refused = GpuExpertCompute::Create(bf16, GluParams{}, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("expert 0 up"), std::string::npos) << refused.status();
  auto no_device = GpuExpertCompute::Create(e.weights, GluParams{}, 1000);
  EXPECT_EQ(no_device.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  absl::StatusOr<int> devices = k3::CudaDeviceCount();
  k3::have_gpu = devices.ok();
  if (!k3::have_gpu) printf("skipped: no GPU (%s)\n", devices.status().ToString().c_str());
  return RUN_ALL_TESTS();
}
