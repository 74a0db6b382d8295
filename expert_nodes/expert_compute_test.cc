#include "expert_nodes/expert_compute.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/thread_pool.h"

namespace k3 {
namespace {

constexpr int64_t kWidth = 64;   // d
constexpr int64_t kHidden = 32;  // f

struct Experts {
  std::vector<std::vector<float>> data;  // per expert: gate, up [f, d] then down [d, f]
  std::vector<GatedMlpWeights> weights;
};

Experts RandomExperts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.2f);
  Experts e;
  e.data.resize(count);
  for (int i = 0; i < count; ++i) {
    e.data[i].resize(3 * kWidth * kHidden);
    for (float& v : e.data[i]) v = dist(rng);
  }
  for (int i = 0; i < count; ++i) {
    const float* p = e.data[i].data();
    e.weights.push_back(
        GatedMlpWeights{WeightMatrix{p, WeightType::kF32, kHidden, kWidth},
                        WeightMatrix{p + kWidth * kHidden, WeightType::kF32, kHidden, kWidth},
                        WeightMatrix{p + 2 * kWidth * kHidden, WeightType::kF32, kWidth, kHidden}});
  }
  return e;
}

// The formula of expert_compute.h, one assignment at a time, in double.
std::vector<double> Reference(const Experts& e, const GluParams& params,
                              const std::vector<float>& z, int64_t rows,
                              const std::vector<ExpertAssignment>& assignments) {
  std::vector<double> out(rows * kWidth, 0.0);
  for (const ExpertAssignment& a : assignments) {
    const GatedMlpWeights& w = e.weights[a.expert];
    std::vector<double> hidden(kHidden);
    for (int64_t f = 0; f < kHidden; ++f) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < kWidth; ++c) {
        g += double{w.gate.At(f, c)} * z[a.row * kWidth + c];
        u += double{w.up.At(f, c)} * z[a.row * kWidth + c];
      }
      hidden[f] = GluCombine(params, static_cast<float>(g), static_cast<float>(u));
    }
    for (int64_t d = 0; d < kWidth; ++d) {
      double y = 0;
      for (int64_t f = 0; f < kHidden; ++f) y += double{w.down.At(d, f)} * hidden[f];
      out[a.row * kWidth + d] += a.weight * y;
    }
  }
  return out;
}

// More experts than kernel threads (BUILD sets 3), each with a different number of rows: the
// threads share the experts out, and every row's sum matches the slow path and is the same
// on every call, whichever thread ran which expert.
TEST(RunExpertsTest, ExpertsSharedOverThreadsMatchTheFormulaAndRepeat) {
  ASSERT_GE(KernelThreadCount(), 2);
  const Experts experts = RandomExperts(7, 1);
  const GluParams params;
  const int64_t rows = 12;
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> z(rows * kWidth);
  for (float& v : z) v = dist(rng);
  std::vector<ExpertAssignment> assignments;
  // Expert e takes rows [0, e + 1) (uneven groups), and expert 6 every row.
  for (int32_t e = 0; e < 6; ++e) {
    for (int32_t r = 0; r <= e; ++r) assignments.push_back({r, e, 0.1f * (e + 1)});
  }
  for (int32_t r = 0; r < rows; ++r) assignments.push_back({r, 6, 0.5f});

  const std::vector<double> want = Reference(experts, params, z, rows, assignments);
  ExpertScratch scratch;
  std::vector<float> first(rows * kWidth), again(rows * kWidth, -1.f);
  ASSERT_TRUE(RunExperts(experts.weights, params, z.data(), rows, kWidth, assignments, first.data(),
                         &scratch)
                  .ok());
  for (int64_t i = 0; i < rows * kWidth; ++i) {
    EXPECT_NEAR(first[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "element " << i;
  }
  for (int call = 0; call < 20; ++call) {
    ASSERT_TRUE(RunExperts(experts.weights, params, z.data(), rows, kWidth, assignments,
                           again.data(), &scratch)
                    .ok());
    ASSERT_EQ(again, first) << "call " << call;
  }
}

TEST(RunExpertsTest, BadAssignmentsFailWithTheirReason) {
  Experts experts = RandomExperts(2, 3);
  experts.weights[1] = GatedMlpWeights{};  // not hosted here
  const std::vector<float> z(2 * kWidth, 1.f);
  std::vector<float> out(2 * kWidth);
  ExpertScratch scratch;
  absl::Status row = RunExperts(experts.weights, GluParams{}, z.data(), 2, kWidth, {{2, 0, 1.f}},
                                out.data(), &scratch);
  EXPECT_EQ(row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(row.message().find("row 2 outside [0, 2)"), std::string::npos) << row;
  absl::Status expert = RunExperts(experts.weights, GluParams{}, z.data(), 2, kWidth, {{0, 1, 1.f}},
                                   out.data(), &scratch);
  EXPECT_EQ(expert.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(expert.message().find("expert 1 is not hosted"), std::string::npos) << expert;
}

}  // namespace
}  // namespace k3
