#include "tools/memory_plan.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "moe/expert_placement.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

enum class Tier { kAttention, kRouter, kExpert, kUnused };

struct Classified {
  Tier tier = Tier::kUnused;
  int layer = -1, expert = -1;
};

// Consumes "<integer>." from the front of `rest`.
bool TakeIndex(std::string_view* rest, int* out) {
  const size_t dot = rest->find('.');
  if (dot == std::string_view::npos || !absl::SimpleAtoi(Sv(rest->substr(0, dot)), out)) {
    return false;
  }
  rest->remove_prefix(dot + 1);
  return true;
}

Classified Classify(std::string_view name) {
  Classified c;
  if (name.starts_with("language_model.")) name.remove_prefix(strlen("language_model."));
  if (name.starts_with("lm_head.")) {
    c.tier = Tier::kAttention;
    return c;
  }
  if (!name.starts_with("model.")) return c;
  c.tier = Tier::kAttention;
  std::string_view rest = name.substr(strlen("model."));
  if (!rest.starts_with("layers.")) return c;
  rest.remove_prefix(strlen("layers."));
  if (!TakeIndex(&rest, &c.layer)) return c;
  if (rest.starts_with("block_sparse_moe.experts.")) {
    rest.remove_prefix(strlen("block_sparse_moe.experts."));
    if (TakeIndex(&rest, &c.expert)) c.tier = Tier::kExpert;
  } else if (rest.starts_with("block_sparse_moe.gate.") ||
             rest.starts_with("block_sparse_moe.routed_expert_down_proj.") ||
             rest.starts_with("block_sparse_moe.routed_expert_norm.")) {
    c.tier = Tier::kRouter;
  }
  return c;
}

std::string Bytes(uint64_t bytes) {
  return absl::StrFormat("%20u B %10.2f GiB", bytes, bytes / 1073741824.0);
}

// Each expert's worker (the result, indexed by expert) and plan->expert_worker_slices, as the
// coordinator places them; INVALID_ARGUMENT when a worker would get no expert.
absl::StatusOr<std::vector<int>> PlaceExperts(const ModelConfig& config,
                                              const MemoryPlanTopology& topology,
                                              MemoryPlan* plan) {
  // Equal capacities (each large enough for all experts): slices floor(N w / E).
  const int num_experts = std::max(config.num_experts, 1);
  K3_ASSIGN_OR_RETURN(
      ExpertPlacement placement,
      ContiguousPlacement(1, num_experts, std::vector<int>(topology.experts, num_experts)));
  std::vector<int> worker_of(num_experts);
  plan->expert_worker_slices.assign(topology.experts, {0, 0});
  for (int w = 0; w < topology.experts; ++w) {
    const std::vector<int> experts = placement.ExpertsOn(w, 0);
    if (experts.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(topology.experts, " expert workers for ",
                                                     config.num_experts, " experts leave worker ",
                                                     w, " without any"));
    }
    for (int e : experts) worker_of[e] = w;
    plan->expert_worker_slices[w] = {experts.front(), experts.back() + 1};
  }
  return worker_of;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const std::string& dir, const MemoryPlanTopology& topology) {
  K3_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  if (topology.attention < 1 || topology.routers < 1 || topology.experts < 1) {
    return absl::InvalidArgumentError("a topology needs at least one process in each tier");
  }
  MemoryPlan plan;
  plan.topology = topology;
  plan.num_experts = config.num_experts;
  plan.top_k = config.num_experts_per_token;
  plan.moe_layers = config.NumMoeLayers();
  K3_ASSIGN_OR_RETURN(std::vector<int> worker_of, PlaceExperts(config, topology, &plan));
  plan.expert_worker_bytes.assign(topology.experts, 0);
  std::vector<uint64_t> expert_layer_bytes(config.num_hidden_layers, 0);
  uint64_t embedding_bytes = 0;

  K3_ASSIGN_OR_RETURN(std::vector<std::string> files, CheckpointFiles(dir));
  plan.files = static_cast<int>(files.size());
  for (const std::string& file : files) {
    K3_ASSIGN_OR_RETURN(auto tensors, ReadSafetensorsHeader(file));
    for (const auto& [name, info] : tensors) {
      const uint64_t bytes = info.end - info.begin;
      plan.checkpoint_bytes += bytes;
      const Classified c = Classify(name);
      if (c.layer >= config.num_hidden_layers ||
          (c.tier == Tier::kExpert && c.expert >= config.num_experts)) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": tensor '", name, "' is outside the config's ",
                         config.num_hidden_layers, " layers and ", config.num_experts, " experts"));
      }
      switch (c.tier) {
        case Tier::kAttention:
          plan.attention_bytes += bytes;
          if (std::string_view(name).ends_with("model.embed_tokens.weight"))
            embedding_bytes = bytes;
          break;
        case Tier::kRouter:
          plan.router_bytes += bytes;
          break;
        case Tier::kExpert:
          plan.expert_worker_bytes[worker_of[c.expert]] += bytes;
          expert_layer_bytes[c.layer] += bytes;
          break;
        default:
          plan.unused_bytes += bytes;
          break;
      }
    }
  }
  plan.total_mapped =
      topology.attention * plan.attention_bytes + topology.routers * plan.router_bytes;
  for (uint64_t bytes : plan.expert_worker_bytes) plan.total_mapped += bytes;
  plan.attention_token_bytes = plan.attention_bytes - embedding_bytes +
                               embedding_bytes / std::max<int64_t>(config.vocab_size, 1);
  plan.router_token_bytes = plan.router_bytes;
  uint64_t expert_bytes = 0;
  for (uint64_t bytes : expert_layer_bytes) {
    plan.expert_token_bytes +=
        bytes / std::max(config.num_experts, 1) * config.num_experts_per_token;
    expert_bytes += bytes;
  }
  plan.expert_id_bytes = expert_bytes / std::max(config.num_experts, 1);
  if (plan.expert_id_bytes > 0) {
    plan.experts_per_gpu = static_cast<int>(
        std::min<uint64_t>(kGpuExpertBudget / plan.expert_id_bytes, config.num_experts));
    if (plan.experts_per_gpu > 0) {
      plan.min_gpus = (config.num_experts + plan.experts_per_gpu - 1) / plan.experts_per_gpu;
    }
  }
  return plan;
}

std::string FormatMemoryPlan(const MemoryPlan& p) {
  std::string out =
      absl::StrCat("checkpoint: ", Bytes(p.checkpoint_bytes), " of tensors in ", p.files,
                   " files (", Bytes(p.unused_bytes), " unused)\n", "bytes each process maps:\n");
  absl::StrAppend(&out, absl::StrFormat("  attention x%-4d %s each\n", p.topology.attention,
                                        Bytes(p.attention_bytes)));
  absl::StrAppend(&out, absl::StrFormat("  router    x%-4d %s each\n", p.topology.routers,
                                        Bytes(p.router_bytes)));
  for (size_t w = 0; w < p.expert_worker_bytes.size(); ++w) {
    absl::StrAppend(
        &out, absl::StrFormat("  expert %-8d %s  (experts %d..%d of %d in each of %d "
                              "MoE layers)\n",
                              w, Bytes(p.expert_worker_bytes[w]), p.expert_worker_slices[w].first,
                              p.expert_worker_slices[w].second - 1, p.num_experts, p.moe_layers));
  }
  absl::StrAppend(&out, absl::StrFormat("  total           %s\n", Bytes(p.total_mapped)));
  absl::StrAppend(&out, "weight bytes read per decoded token (one sequence):\n");
  absl::StrAppend(&out, absl::StrFormat("  attention tier  %s\n", Bytes(p.attention_token_bytes)));
  absl::StrAppend(&out, absl::StrFormat("  router tier     %s\n", Bytes(p.router_token_bytes)));
  absl::StrAppend(
      &out, absl::StrFormat("  expert tier     %s  (%d of %d experts x %d MoE layers)\n",
                            Bytes(p.expert_token_bytes), p.top_k, p.num_experts, p.moe_layers));
  absl::StrAppend(&out, absl::StrFormat("  total           %s\n",
                                        Bytes(p.attention_token_bytes + p.router_token_bytes +
                                              p.expert_token_bytes)));
  if (p.expert_id_bytes > 0) {
    const uint64_t largest =
        *std::max_element(p.expert_worker_bytes.begin(), p.expert_worker_bytes.end());
    auto gib = [](uint64_t bytes) { return absl::StrFormat("%.3f GiB", bytes / 1073741824.0); };
    absl::StrAppend(
        &out, absl::StrFormat("expert workers on H200 GPUs (--device cuda, %s for experts each):\n"
                              "  %d experts per MoE layer per GPU (%s per expert over %d MoE "
                              "layers); at least %d GPUs for %d experts\n"
                              "  the largest expert worker here needs %s (%s)\n",
                              gib(kGpuExpertBudget), p.experts_per_gpu, gib(p.expert_id_bytes),
                              p.moe_layers, p.min_gpus, p.num_experts, gib(largest),
                              largest <= kGpuExpertBudget ? "fits" : "does not fit"));
  }
  return out;
}

}  // namespace k3
