#include "expert_nodes/expert_compute.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::Status RunExperts(const std::vector<GatedMlpWeights>& experts, const GluParams& params,
                        const float* z, int64_t rows, int64_t width,
                        const std::vector<ExpertAssignment>& assignments, float* out,
                        ExpertScratch* scratch) {
  for (const ExpertAssignment& a : assignments) {
    if (a.row < 0 || a.row >= rows) {
      return absl::InvalidArgumentError(absl::StrCat("expert assignment row ", a.row,
                                                     " outside [0, ", rows, ")"));
    }
    if (a.expert < 0 || a.expert >= static_cast<int64_t>(experts.size()) ||
        experts[a.expert].gate.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", a.expert, " is not hosted by this worker"));
    }
  }
  std::fill(out, out + rows * width, 0.f);
  // Stable order by expert, so rows sum in a fixed order and results are reproducible.
  std::vector<int32_t>& order = scratch->order;
  order.resize(assignments.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return assignments[a].expert < assignments[b].expert;
  });
  for (size_t begin = 0; begin < order.size();) {
    const int32_t expert = assignments[order[begin]].expert;
    size_t end = begin;
    while (end < order.size() && assignments[order[end]].expert == expert) ++end;
    const int64_t count = static_cast<int64_t>(end - begin);
    scratch->gathered.resize(static_cast<size_t>(count * width));
    scratch->answer.resize(static_cast<size_t>(count * width));
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(scratch->gathered.data() + i * width, z + assignments[order[begin + i]].row * width,
                  sizeof(float) * width);
    }
    const GatedMlpWeights& w = experts[expert];
    GatedMlp(GatedMlpMatrices{w.gate, w.up, w.down}, params, scratch->gathered.data(), count,
             scratch->answer.data(), false, &scratch->mlp);
    for (int64_t i = 0; i < count; ++i) {
      const ExpertAssignment& a = assignments[order[begin + i]];
      float* dst = out + a.row * width;
      const float* src = scratch->answer.data() + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] += a.weight * src[j];
    }
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace k3
