#include "bench/step_breakdown.h"

#include <cstdlib>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "httplib.h"

namespace k3 {

namespace {

const char* const kFamilies[] = {
    "k3_attention_step_seconds",          "k3_attention_step_compute_seconds",
    "k3_attention_step_moe_wait_seconds", "k3_attention_layer_moe_wait_seconds",
    "k3_router_step_compute_seconds",     "k3_router_step_expert_wait_seconds",
    "k3_expert_request_seconds"};

}  // namespace

StepBreakdown ScrapeStepBreakdown(const LocalCluster& cluster) {
  StepBreakdown out;
  for (const LocalCluster::Node& node : cluster.nodes()) {
    if (node.metrics_address.empty()) continue;
    const size_t colon = node.metrics_address.rfind(':');
    httplib::Client client(node.metrics_address.substr(0, colon),
                           std::atoi(node.metrics_address.c_str() + colon + 1));
    httplib::Result response = client.Get("/metrics");
    if (!response || response->status != 200) {
      std::cerr << "cannot scrape " << node.name << "'s /metrics\n";
      continue;
    }
    for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
      for (const char* family : kFamilies) {
        double value = 0;
        absl::string_view rest = line;
        if (!absl::ConsumePrefix(&rest, family)) continue;
        if (absl::ConsumePrefix(&rest, "_sum ") && absl::SimpleAtod(rest, &value)) {
          out[family].sum += value;
        } else if (absl::ConsumePrefix(&rest, "_count ") && absl::SimpleAtod(rest, &value)) {
          out[family].count += value;
        }
      }
    }
  }
  return out;
}

StepBreakdown Minus(const StepBreakdown& later, const StepBreakdown& earlier) {
  StepBreakdown out = later;
  for (const auto& [family, before] : earlier) {
    out[family].sum -= before.sum;
    out[family].count -= before.count;
  }
  return out;
}

void PrintStepBreakdown(const std::string& name, const StepBreakdown& breakdown) {
  StepBreakdown h = breakdown;
  const SumCount& step = h[kFamilies[0]];
  const SumCount& compute = h[kFamilies[1]];
  const SumCount& wait = h[kFamilies[2]];
  const SumCount& layer = h[kFamilies[3]];
  const SumCount& router_compute = h[kFamilies[4]];
  const SumCount& router_wait = h[kFamilies[5]];
  const SumCount& expert = h[kFamilies[6]];
  const double share = step.sum > 0 ? wait.sum / step.sum : 0;
  std::cout << absl::StrFormat(
      "%-10s breakdown (from /metrics): attention %.0f steps, %.3f ms/step = compute "
      "%.3f + MoE wait %.3f (%.0f%% waiting)\n"
      "%-10s   per MoE layer step: attention waits %.3f ms = router compute %.3f + router's "
      "expert wait %.3f (experts compute %.3f over %.2f requests, wire+queue ~%.3f) + "
      "attention<->router wire+queue ~%.3f\n",
      name, step.count, step.MeanMs(), compute.MeanMs(), wait.MeanMs(), 100 * share, name,
      layer.MeanMs(), router_compute.MeanMs(), router_wait.MeanMs(),
      router_wait.count > 0 ? expert.sum * 1e3 / router_wait.count : 0,
      router_wait.count > 0 ? expert.count / router_wait.count : 0,
      router_wait.count > 0 ? router_wait.MeanMs() - expert.sum * 1e3 / router_wait.count : 0,
      layer.MeanMs() - router_compute.MeanMs() - router_wait.MeanMs());
}

}  // namespace k3
