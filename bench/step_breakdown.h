// Where a local cluster's steps spent their time, read from every node's /metrics: the
// attention worker's compute and MoE wait per step and per MoE layer, the router's compute and
// expert wait per layer step, and the expert workers' compute per request. The histograms are
// cumulative, so a part of a run is the difference of two scrapes.
#ifndef K3SERVE_BENCH_STEP_BREAKDOWN_H_
#define K3SERVE_BENCH_STEP_BREAKDOWN_H_

#include <map>
#include <string>

#include "launcher/local_cluster.h"

namespace k3 {

// Sum and count of a histogram, over every node scraped.
struct SumCount {
  double sum = 0;
  double count = 0;
  double MeanMs() const { return count > 0 ? 1e3 * sum / count : 0; }
};

// By histogram family name.
using StepBreakdown = std::map<std::string, SumCount>;

// The step histograms of every node of `cluster` that serves /metrics (LocalClusterOptions::
// metrics); a node that cannot be scraped is reported on stderr and left out.
StepBreakdown ScrapeStepBreakdown(const LocalCluster& cluster);

// later - earlier, family by family.
StepBreakdown Minus(const StepBreakdown& later, const StepBreakdown& earlier);

// Two lines on stdout, each starting with `name`.
void PrintStepBreakdown(const std::string& name, const StepBreakdown& breakdown);

}  // namespace k3

#endif  // K3SERVE_BENCH_STEP_BREAKDOWN_H_
