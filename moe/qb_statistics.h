// QB load-balancing statistics (spec §8, "QB, K3"): what a router gathers about one MoE layer so
// that a new e_score_correction_bias and an expert placement can be computed from its traffic.
//
// For a routed token i with sigmoid scores s_i and the bias b in force, α_i is the (k+1)-th largest
// of s_i + b and r_ij = α_i − s_ij. Expert j wins token i exactly when s_ij + b_j > α_i, i.e. when
// b_j > r_ij, so the bias that lets expert j win a share k/N of the tokens (cutoffs held fixed) is
// the k/N quantile of r[:, j]. Quantiles of separate batches cannot be combined, but histograms
// can: per expert we keep a histogram of r over [min(b) − 1, max(b) + 1] (every r lies there
// because s ∈ [0, 1]) plus the count of tokens routed to the expert. Histograms of routers that
// used the same bias add up to the histogram of the pooled tokens, whatever the split.
#ifndef K3SERVE_MOE_QB_STATISTICS_H_
#define K3SERVE_MOE_QB_STATISTICS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace k3 {

// One layer's statistics as plain vectors, the shape of a protobuf message (repeated float bias,
// repeated uint64 loads and counts). The histogram range is not stored: it follows from `bias`.
struct QbLayerStatisticsData {
  int32_t layer = 0;  // the caller's layer id, carried through Merge unchanged
  int32_t top_k = 0;
  int32_t bins = 0;              // histogram bins per expert
  std::vector<float> bias;       // [num_experts], the bias the tokens were routed with
  uint64_t tokens = 0;           // tokens recorded
  std::vector<uint64_t> loads;   // [num_experts], tokens routed to each expert
  std::vector<uint64_t> counts;  // [num_experts * bins], expert-major histograms of r
};

// Accumulates QB statistics for one MoE layer.
//
// Thread-safety: none; give each routing thread its own object and Merge them. A value type:
// copying copies the histograms (num_experts * bins * 8 bytes; 7.2 MB for 896 experts × 1000 bins).
class QbLayerStatistics {
 public:
  static constexpr int kDefaultBins = 1000;

  // `bias` is the layer's bias in force while recording ([num_experts], finite); it needs
  // num_experts > top_k >= 1 and bins >= 1.
  static absl::StatusOr<QbLayerStatistics> Create(int layer, int top_k,
                                                  absl::Span<const float> bias,
                                                  int bins = kDefaultBins);
  // Checks sizes and that every expert's histogram holds `tokens` values and the loads sum to
  // tokens * top_k, as Record guarantees.
  static absl::StatusOr<QbLayerStatistics> FromData(QbLayerStatisticsData data);
  const QbLayerStatisticsData& data() const { return data_; }

  int layer() const { return data_.layer; }
  int num_experts() const { return static_cast<int>(data_.bias.size()); }
  int top_k() const { return data_.top_k; }
  int bins() const { return data_.bins; }
  uint64_t tokens() const { return data_.tokens; }
  const std::vector<uint64_t>& loads() const { return data_.loads; }
  double range_lo() const { return range_lo_; }
  double range_hi() const { return range_hi_; }
  double bin_width() const { return (range_hi_ - range_lo_) / data_.bins; }

  // Routes each token with the stored bias (top-k of s + b, ties to the lower expert id, as the
  // router does) and records it. scores: [tokens, num_experts], each in [0, 1].
  void Record(const float* scores, int64_t tokens);
  // Records tokens the router has already routed with the stored bias: ids [tokens, top_k] are
  // its chosen experts (distinct, in range). α_i is then the largest s + b outside the chosen set.
  void RecordRouted(const float* scores, const int32_t* ids, int64_t tokens);

  // Adds `other`'s counts. InvalidArgument unless layer, top_k, bins and the bias (bit for bit)
  // match: r has a different distribution under another bias.
  absl::Status Merge(const QbLayerStatistics& other);

  // The uncentred QB estimate: for each expert the k/N quantile of its r histogram, interpolating
  // linearly inside the bin where the cumulative count reaches (k/N) * tokens.
  // FailedPrecondition when no token has been recorded.
  absl::StatusOr<std::vector<float>> EstimateBias() const;

  // MaxVio of the recorded loads (see MaxVio below); 0 before any token.
  double MaxVio() const;

 private:
  explicit QbLayerStatistics(QbLayerStatisticsData data);

  QbLayerStatisticsData data_;
  double range_lo_ = 0;  // min(bias) - 1
  double range_hi_ = 0;  // max(bias) + 1
};

// (max_j load_j − mean load) / mean load; 0 when every load is 0 or `loads` is empty.
double MaxVio(absl::Span<const uint64_t> loads);

// Tokens each expert receives when `tokens` rows of scores ([tokens, num_experts]) are routed with
// `bias` (top-k of s + b, ties to the lower expert id). REQUIRES: num_experts > top_k >= 1.
std::vector<uint64_t> RouteLoads(const float* scores, int64_t tokens, int num_experts, int top_k,
                                 absl::Span<const float> bias);

// The linear-interpolation ("type 7") sample quantile: with v sorted and h = (n − 1) q, the value
// v[⌊h⌋] + (h − ⌊h⌋)(v[⌊h⌋ + 1] − v[⌊h⌋]). REQUIRES: values non-empty, q in [0, 1].
double Type7Quantile(std::vector<double> values, double q);

// The uncentred QB estimate from raw values instead of histograms: per expert the type-7 k/N
// quantile of r[:, j] over the given tokens routed with `bias`. REQUIRES: tokens >= 1,
// num_experts > top_k >= 1.
std::vector<float> ExactQbBias(const float* scores, int64_t tokens, int num_experts, int top_k,
                               absl::Span<const float> bias);

// b − mean(b), the form in which a QB estimate becomes the next bias.
std::vector<float> CenterBias(absl::Span<const float> bias);

}  // namespace k3

#endif  // K3SERVE_MOE_QB_STATISTICS_H_
