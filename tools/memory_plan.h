// PlanMemory: sizes a cluster before it exists. From a checkpoint's config.json and safetensors
// headers alone (no tensor data is read, so a headers-only checkpoint, model/random_checkpoint.h's
// headers_only, is enough), it says what each process of a topology maps and how many weight bytes
// each tier reads per decoded token.
//
// Shares follow WeightSelection (model/weights.h): an attention process maps everything but the
// routers' share and the routed experts; a router maps gate.weight, e_score_correction_bias and the
// latent down projection and norm; expert worker w maps, in every MoE layer, the routed experts of
// its slice in ContiguousPlacement (moe/expert_placement.h) with equal slots (no spares).
// Tensors outside the text model (neither "model." nor "lm_head." once the "language_model."
// prefix is dropped, e.g. a vision tower) are unused. Bytes are file bytes: an MXFP4 expert counts
// its codes and scales, which is what the loader maps (it widens vectors to fp32; those are small).
//
// Per decoded token of one sequence: the attention tier reads its share with one embedding row
// instead of the table, a router its share, the expert tier top-k experts per MoE layer (at the
// layer's mean expert size). KV caches and activations are not counted.
//
// Thread-safety: pure functions.
#ifndef K3SERVE_TOOLS_MEMORY_PLAN_H_
#define K3SERVE_TOOLS_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

struct MemoryPlanTopology {
  int attention = 1, routers = 1, experts = 1;  // processes of each tier
};

struct MemoryPlan {
  MemoryPlanTopology topology;
  int num_experts = 0, top_k = 0, moe_layers = 0;
  uint64_t attention_bytes = 0;                           // each attention process
  uint64_t router_bytes = 0;                              // each router
  std::vector<uint64_t> expert_worker_bytes;              // per expert worker
  std::vector<std::pair<int, int>> expert_worker_slices;  // its experts [first, end) per layer
  uint64_t unused_bytes = 0;                              // in the files, mapped by no process
  uint64_t checkpoint_bytes = 0;                          // all tensor data in the files
  uint64_t total_mapped = 0;                              // summed over every process
  int files = 0;
  // Weight bytes read per decoded token.
  uint64_t attention_token_bytes = 0, router_token_bytes = 0, expert_token_bytes = 0;
  // Expert workers on GPUs (`k3serve expert --device cuda`), which copy their packed experts to
  // device memory at the file's size: one expert id's bytes over every MoE layer (the mean), how
  // many expert ids per MoE layer fit kGpuExpertBudget, and so how many such GPUs the whole expert
  // tier needs at least (0 and 0 when one expert id does not fit).
  uint64_t expert_id_bytes = 0;
  int experts_per_gpu = 0, min_gpus = 0;
};

// An H200's memory as a process sees it (about 139 GiB) less 2 GiB for the CUDA context and the
// expert kernels' scratch: the budget for packed experts on one GPU.
inline constexpr uint64_t kGpuExpertBudget = uint64_t{137} << 30;

// InvalidArgument for a topology with fewer than one process in a tier or more expert workers
// than experts, or a tensor name whose layer or expert is outside the config; the checkpoint's
// own errors (missing files, bad headers) name the file.
absl::StatusOr<MemoryPlan> PlanMemory(const std::string& dir, const MemoryPlanTopology& topology);

// A table for people: bytes and GiB per process, the total, and the per-token reads.
std::string FormatMemoryPlan(const MemoryPlan& plan);

}  // namespace k3

#endif  // K3SERVE_TOOLS_MEMORY_PLAN_H_
