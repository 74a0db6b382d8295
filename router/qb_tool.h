// The offline QB tool behind `k3serve qb`: one QB bias update (spec §8) from a file of router
// scores, as a check of a layer's e_score_correction_bias against recorded traffic.
//
// Input: raw little-endian float32 sigmoid scores [tokens, experts] and optionally a float32 bias
// [experts] (zeros when absent). Output, to `out`: the new centred bias, one value per line in
// expert order, then `maxvio_old <v>` (the scores routed with the given bias) and
// `maxvio_new <v>` (the same scores routed with the new bias).
#ifndef K3SERVE_ROUTER_QB_TOOL_H_
#define K3SERVE_ROUTER_QB_TOOL_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "moe/qb_statistics.h"

namespace k3 {

struct QbToolOptions {
  std::string scores_path;                     // --scores
  int64_t tokens = 0;                          // --tokens
  int experts = 0;                             // --experts
  int top_k = 0;                               // --top-k
  std::string bias_path;                       // --bias; empty: a zero bias
  int bins = QbLayerStatistics::kDefaultBins;  // --bins
  bool exact = false;  // --exact: type-7 quantiles of the raw values instead of histograms
};

// Runs the tool. InvalidArgument for inconsistent options, a file whose size does not match
// tokens × experts (or experts) float32 values, a score outside [0, 1] or a non-finite bias;
// NotFound / the OS error when a file cannot be read. Nothing is written to `out` on error.
absl::Status RunQbTool(const QbToolOptions& options, std::ostream& out);

}  // namespace k3

#endif  // K3SERVE_ROUTER_QB_TOOL_H_
