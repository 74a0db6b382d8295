#include "expert_nodes/expert_compute.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/thread_pool.h"

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
  std::vector<ExpertScratch::Group>& groups = scratch->groups;
  size_t count = 0;
  for (size_t begin = 0; begin < order.size(); ++count) {
    const int32_t expert = assignments[order[begin]].expert;
    size_t end = begin;
    while (end < order.size() && assignments[order[end]].expert == expert) ++end;
    if (groups.size() <= count) groups.emplace_back();
    groups[count].expert = expert;
    groups[count].begin = begin;
    groups[count].end = end;
    begin = end;
  }
  auto run_group = [&](ExpertScratch::Group& group) {
    const int64_t rows_in = static_cast<int64_t>(group.end - group.begin);
    group.gathered.resize(static_cast<size_t>(rows_in * width));
    group.answer.resize(static_cast<size_t>(rows_in * width));
    for (int64_t i = 0; i < rows_in; ++i) {
      std::memcpy(group.gathered.data() + i * width,
                  z + assignments[order[group.begin + i]].row * width, sizeof(float) * width);
    }
    const GatedMlpWeights& w = experts[group.expert];
    GatedMlp(GatedMlpMatrices{w.gate, w.up, w.down}, params, group.gathered.data(), rows_in,
             group.answer.data(), false, &group.mlp);
  };
  if (static_cast<int>(count) >= KernelThreadCount()) {
    // Nested ParallelFor calls inside run inline, so each expert runs on one thread. The threads
    // take experts one at a time, those with the most rows first: experts differ in their rows,
    // and a thread that is slowed down (a busy machine) takes fewer, instead of holding up a
    // fixed share.
    std::vector<int32_t>& by_rows = scratch->by_rows;
    by_rows.resize(count);
    std::iota(by_rows.begin(), by_rows.end(), 0);
    std::stable_sort(by_rows.begin(), by_rows.end(), [&](int32_t a, int32_t b) {
      return groups[a].end - groups[a].begin > groups[b].end - groups[b].begin;
    });
    std::atomic<size_t> next{0};
    WakeKernelThreads();
    ParallelFor(KernelThreadCount(), 1, [&](int64_t, int64_t) {
      for (size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
        run_group(groups[by_rows[i]]);
      }
    });
  } else {
    for (size_t g = 0; g < count; ++g) run_group(groups[g]);
  }
  for (size_t g = 0; g < count; ++g) {
    const ExpertScratch::Group& group = groups[g];
    for (size_t i = 0; i < group.end - group.begin; ++i) {
      const ExpertAssignment& a = assignments[order[group.begin + i]];
      float* dst = out + a.row * width;
      const float* src = group.answer.data() + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] += a.weight * src[j];
    }
  }
  return absl::OkStatus();
}

}  // namespace k3
