// Routed-expert computation of one MoE layer on an expert worker (spec §7.2):
//   out[row] = Σ_{(row, e, w) ∈ assignments} w · E_e(z[row])
// grouped by expert, so each expert's weights are streamed once per step whatever the number of
// rows that chose it. With at least as many experts as kernel threads, whole experts are spread
// over the threads (a decode step's expert products are too small to split well); otherwise each
// product is split. Accumulation is fp32, in the same order either way.
#ifndef K3SERVE_EXPERT_NODES_EXPERT_COMPUTE_H_
#define K3SERVE_EXPERT_NODES_EXPERT_COMPUTE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "moe/expert_assignment.h"
#include "kernels/gated_mlp.h"
#include "model/glu_params.h"
#include "model/weights.h"

namespace k3 {

// Scratch reused across calls by one caller; not thread-safe to share.
struct ExpertScratch {
  struct Group {  // one expert's rows of a call
    int32_t expert = 0;
    size_t begin = 0, end = 0;  // range of `order`
    std::vector<float> gathered, answer, mlp;
  };
  std::vector<Group> groups;
  std::vector<int32_t> order;
  std::vector<int32_t> by_rows;  // groups, most rows first
};

// z: [rows, width]; out: [rows, width], overwritten. InvalidArgument for an out-of-range row or an
// expert this process does not host (empty weights).
absl::Status RunExperts(const std::vector<GatedMlpWeights>& experts, const GluParams& params,
                        const float* z, int64_t rows, int64_t width,
                        const std::vector<ExpertAssignment>& assignments, float* out,
                        ExpertScratch* scratch);

}  // namespace k3

#endif  // K3SERVE_EXPERT_NODES_EXPERT_COMPUTE_H_
