#include "moe/qb_statistics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

// Tokens per block in RecordRouted: the block's scores ([kBlock, num_experts] floats, 230 KB for
// 896 experts) stay in cache while each expert's histogram is updated in turn, so the scattered
// increments hit one expert's 8 KB of counts instead of num_experts different cache lines per
// token.
constexpr int64_t kBlock = 64;

// Writes the top_k + 1 largest s + b (ties to the lower expert id), best first, to ids and
// values (room for top_k + 1 each): ids[0..top_k) are the chosen experts and values[top_k] is α.
// One pass keeping a sorted list; most experts fail the first comparison, so this is several times
// faster than nth_element on all of them.
void SelectTopK(const float* scores, const float* bias, int num_experts, int top_k, int32_t* ids,
                float* values) {
  const int keep = top_k + 1;
  int size = 0;
  for (int e = 0; e < num_experts; ++e) {
    const float v = scores[e] + bias[e];
    // Experts come in ascending id order, so an equal value ranks after those already kept.
    if (size == keep && !(v > values[keep - 1])) continue;
    int p = size < keep ? size++ : keep - 1;
    for (; p > 0 && values[p - 1] < v; --p) {
      values[p] = values[p - 1];
      ids[p] = ids[p - 1];
    }
    values[p] = v;
    ids[p] = e;
  }
}

}  // namespace

QbLayerStatistics::QbLayerStatistics(QbLayerStatisticsData data) : data_(std::move(data)) {
  auto [lo, hi] = std::minmax_element(data_.bias.begin(), data_.bias.end());
  range_lo_ = static_cast<double>(*lo) - 1.0;
  range_hi_ = static_cast<double>(*hi) + 1.0;
}

absl::StatusOr<QbLayerStatistics> QbLayerStatistics::Create(int layer, int top_k,
                                                            absl::Span<const float> bias,
                                                            int bins) {
  QbLayerStatisticsData data;
  data.layer = layer;
  data.top_k = top_k;
  data.bins = bins;
  data.bias.assign(bias.begin(), bias.end());
  data.loads.assign(bias.size(), 0);
  data.counts.assign(bias.size() * static_cast<size_t>(std::max(bins, 0)), 0);
  return FromData(std::move(data));
}

absl::StatusOr<QbLayerStatistics> QbLayerStatistics::FromData(QbLayerStatisticsData data) {
  const size_t n = data.bias.size();
  if (data.top_k < 1 || static_cast<size_t>(data.top_k) >= n) {
    return absl::InvalidArgumentError(absl::StrCat("QB statistics of layer ", data.layer,
                                                   ": need num_experts > top_k >= 1, got ", n,
                                                   " experts and top_k ", data.top_k));
  }
  if (data.bins < 1) {
    return absl::InvalidArgumentError(absl::StrCat("QB statistics of layer ", data.layer,
                                                   ": bins must be >= 1, got ", data.bins));
  }
  for (size_t j = 0; j < n; ++j) {
    if (!std::isfinite(data.bias[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("QB statistics of layer ", data.layer, ": bias[", j, "] is not finite"));
    }
  }
  if (data.loads.size() != n || data.counts.size() != n * static_cast<size_t>(data.bins)) {
    return absl::InvalidArgumentError(absl::StrCat("QB statistics of layer ", data.layer, ": ", n,
                                                   " experts and ", data.bins, " bins need ", n,
                                                   " loads and ", n * data.bins, " counts, got ",
                                                   data.loads.size(), " and ", data.counts.size()));
  }
  uint64_t load_sum = 0;
  for (uint64_t load : data.loads) load_sum += load;
  if (load_sum != data.tokens * static_cast<uint64_t>(data.top_k)) {
    return absl::InvalidArgumentError(absl::StrCat("QB statistics of layer ", data.layer,
                                                   ": loads sum to ", load_sum, ", not tokens (",
                                                   data.tokens, ") * top_k (", data.top_k, ")"));
  }
  for (size_t j = 0; j < n; ++j) {
    const uint64_t* hist = data.counts.data() + j * data.bins;
    uint64_t total = std::accumulate(hist, hist + data.bins, uint64_t{0});
    if (total != data.tokens) {
      return absl::InvalidArgumentError(absl::StrCat("QB statistics of layer ", data.layer,
                                                     ": histogram of expert ", j, " holds ", total,
                                                     " values, not tokens (", data.tokens, ")"));
    }
  }
  return QbLayerStatistics(std::move(data));
}

void QbLayerStatistics::Record(const float* scores, int64_t tokens) {
  const int n = num_experts();
  const int k = data_.top_k;
  std::vector<int32_t> top(k + 1);
  std::vector<float> values(k + 1);
  std::vector<int32_t> ids(static_cast<size_t>(kBlock) * k);
  for (int64_t start = 0; start < tokens; start += kBlock) {
    const int64_t count = std::min(kBlock, tokens - start);
    for (int64_t t = 0; t < count; ++t) {
      SelectTopK(scores + (start + t) * n, data_.bias.data(), n, k, top.data(), values.data());
      std::copy(top.begin(), top.begin() + k, ids.begin() + t * k);
    }
    RecordRouted(scores + start * n, ids.data(), count);
  }
}

void QbLayerStatistics::RecordRouted(const float* scores, const int32_t* ids, int64_t tokens) {
  const int n = num_experts();
  const int k = data_.top_k;
  const int bins = data_.bins;
  const float* bias = data_.bias.data();
  const float lo = static_cast<float>(range_lo_);
  const float scale = static_cast<float>(bins / (range_hi_ - range_lo_));
  const float last = static_cast<float>(bins - 1);
  std::vector<uint8_t> chosen(n, 0);
  float alpha[kBlock];
  for (int64_t start = 0; start < tokens; start += kBlock) {
    const int64_t count = std::min(kBlock, tokens - start);
    const float* block = scores + start * n;
    for (int64_t t = 0; t < count; ++t) {
      const float* s = block + t * n;
      const int32_t* id = ids + (start + t) * k;
      for (int c = 0; c < k; ++c) {
        chosen[id[c]] = 1;
        ++data_.loads[id[c]];
      }
      float a = -INFINITY;
      for (int j = 0; j < n; ++j) {
        if (!chosen[j]) a = std::max(a, s[j] + bias[j]);
      }
      for (int c = 0; c < k; ++c) chosen[id[c]] = 0;
      alpha[t] = a;
    }
    for (int j = 0; j < n; ++j) {
      uint64_t* hist = data_.counts.data() + static_cast<size_t>(j) * bins;
      for (int64_t t = 0; t < count; ++t) {
        float pos = (alpha[t] - block[t * n + j] - lo) * scale;
        // Rounding can put r a hair outside the range; a NaN score lands in bin 0.
        if (!(pos >= 0.f)) pos = 0.f;
        if (pos > last) pos = last;
        ++hist[static_cast<int>(pos)];
      }
    }
  }
  data_.tokens += static_cast<uint64_t>(tokens);
}

absl::Status QbLayerStatistics::Merge(const QbLayerStatistics& other) {
  if (other.data_.layer != data_.layer || other.data_.top_k != data_.top_k ||
      other.data_.bins != data_.bins || other.data_.bias.size() != data_.bias.size() ||
      std::memcmp(other.data_.bias.data(), data_.bias.data(), data_.bias.size() * sizeof(float)) !=
          0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot merge QB statistics of layer ", other.data_.layer, " (top_k ", other.data_.top_k,
        ", ", other.data_.bins, " bins, ", other.data_.bias.size(),
        " experts) into those of layer ", data_.layer, " (top_k ", data_.top_k, ", ", data_.bins,
        " bins, ", data_.bias.size(), " experts): layer, top_k, bins and the bias must all match"));
  }
  data_.tokens += other.data_.tokens;
  for (size_t j = 0; j < data_.loads.size(); ++j) data_.loads[j] += other.data_.loads[j];
  for (size_t i = 0; i < data_.counts.size(); ++i) data_.counts[i] += other.data_.counts[i];
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> QbLayerStatistics::EstimateBias() const {
  if (data_.tokens == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("QB statistics of layer ", data_.layer, " hold no tokens"));
  }
  const int n = num_experts();
  const double target = static_cast<double>(data_.top_k) / n * static_cast<double>(data_.tokens);
  const double width = bin_width();
  std::vector<float> estimate(n);
  for (int j = 0; j < n; ++j) {
    const uint64_t* hist = data_.counts.data() + static_cast<size_t>(j) * data_.bins;
    double cumulative = 0;
    int bin = 0;
    // target <= tokens == the histogram's total, so the loop stops inside the histogram.
    while (hist[bin] == 0 || cumulative + static_cast<double>(hist[bin]) < target) {
      cumulative += static_cast<double>(hist[bin]);
      ++bin;
    }
    const double fraction = (target - cumulative) / static_cast<double>(hist[bin]);
    estimate[j] = static_cast<float>(range_lo_ + width * (bin + fraction));
  }
  return estimate;
}

double QbLayerStatistics::MaxVio() const { return k3::MaxVio(data_.loads); }

double MaxVio(absl::Span<const uint64_t> loads) {
  if (loads.empty()) return 0.0;
  double sum = 0;
  uint64_t max = 0;
  for (uint64_t load : loads) {
    sum += static_cast<double>(load);
    max = std::max(max, load);
  }
  if (sum == 0) return 0.0;
  const double mean = sum / static_cast<double>(loads.size());
  return (static_cast<double>(max) - mean) / mean;
}

std::vector<uint64_t> RouteLoads(const float* scores, int64_t tokens, int num_experts, int top_k,
                                 absl::Span<const float> bias) {
  std::vector<uint64_t> loads(num_experts, 0);
  std::vector<int32_t> top(top_k + 1);
  std::vector<float> values(top_k + 1);
  for (int64_t t = 0; t < tokens; ++t) {
    SelectTopK(scores + t * num_experts, bias.data(), num_experts, top_k, top.data(),
               values.data());
    for (int c = 0; c < top_k; ++c) ++loads[top[c]];
  }
  return loads;
}

double Type7Quantile(std::vector<double> values, double q) {
  const double h = static_cast<double>(values.size() - 1) * q;
  const size_t below = static_cast<size_t>(std::floor(h));
  const double fraction = h - static_cast<double>(below);
  std::nth_element(values.begin(), values.begin() + below, values.end());
  const double low = values[below];
  if (fraction == 0 || below + 1 >= values.size()) return low;
  const double high = *std::min_element(values.begin() + below + 1, values.end());
  return low + fraction * (high - low);
}

std::vector<float> ExactQbBias(const float* scores, int64_t tokens, int num_experts, int top_k,
                               absl::Span<const float> bias) {
  std::vector<float> alpha(tokens);
  std::vector<int32_t> top(top_k + 1);
  std::vector<float> values(top_k + 1);
  for (int64_t t = 0; t < tokens; ++t) {
    SelectTopK(scores + t * num_experts, bias.data(), num_experts, top_k, top.data(),
               values.data());
    alpha[t] = values[top_k];
  }
  const double q = static_cast<double>(top_k) / num_experts;
  std::vector<float> estimate(num_experts);
  std::vector<double> r(tokens);
  for (int j = 0; j < num_experts; ++j) {
    for (int64_t t = 0; t < tokens; ++t) r[t] = alpha[t] - scores[t * num_experts + j];
    estimate[j] = static_cast<float>(Type7Quantile(r, q));
  }
  return estimate;
}

std::vector<float> CenterBias(absl::Span<const float> bias) {
  double sum = 0;
  for (float b : bias) sum += b;
  const double mean = bias.empty() ? 0.0 : sum / static_cast<double>(bias.size());
  std::vector<float> centred(bias.size());
  for (size_t j = 0; j < bias.size(); ++j) centred[j] = static_cast<float>(bias[j] - mean);
  return centred;
}

}  // namespace k3
