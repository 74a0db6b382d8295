#include "engine/held_routing_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// max(a, b), NaN if either is (std::fmax would drop a NaN).
double Worse(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

}  // namespace

void HeldRouting::Reset() {
  recorded_.clear();
  read_.clear();
  slots_ = swaps_ = 0;
}

void HeldRouting::Record(int layer, const std::vector<int32_t>& ids) {
  std::vector<int32_t>& r = recorded_[layer];
  r.insert(r.end(), ids.begin(), ids.end());
}

LocalRoutedMoe::RoutingHook HeldRouting::Replayer() {
  return [this](int layer, Routing* routing) { Replay(layer, routing); };
}

void HeldRouting::Print(const char* what) const {
  std::printf("%s: routing agreement %lld/%lld expert slots (each swap a near tie)\n", what,
              static_cast<long long>(slots_ - swaps_), static_cast<long long>(slots_));
}

void HeldRouting::Replay(int layer, Routing* routing) {
  const std::vector<int32_t>& gpu = recorded_[layer];
  const size_t first = read_[layer], n = routing->experts.size();
  ASSERT_LE(first + n, gpu.size()) << "layer " << layer << ": the CPU ran rows the GPU did not";
  read_[layer] += n;
  const std::vector<float>& bias = weights_->layers[layer].moe.router.score_bias;
  const int k = routing->top_k, experts = routing->num_experts;
  for (int64_t t = 0; t < routing->tokens; ++t) {
    const float* s = routing->scores.data() + t * experts;
    const int32_t* cpu_ids = routing->experts.data() + t * k;
    const int32_t* gpu_ids = gpu.data() + first + t * k;
    const auto choice = [&](int32_t e) { return s[e] + (bias.empty() ? 0.0 : bias[e]); };
    double largest_logit = 0;
    for (int e = 0; e < experts; ++e) {
      largest_logit = Worse(largest_logit, std::fabs(std::log(s[e] / (1.0 - s[e]))));
    }
    const double band = row_error_ * 0.25 * largest_logit;
    const double kth = choice(cpu_ids[k - 1]);  // the CPU lists its choices best first
    for (int j = 0; j < k; ++j) {
      ++slots_;
      ASSERT_GE(gpu_ids[j], 0) << "layer " << layer;
      ASSERT_LT(gpu_ids[j], experts) << "layer " << layer;
      if (std::find(cpu_ids, cpu_ids + k, gpu_ids[j]) != cpu_ids + k) continue;
      ++swaps_;
      EXPECT_GE(choice(gpu_ids[j]), kth - band)
          << "layer " << layer << ": the GPU's expert " << gpu_ids[j] << " is no near tie (band "
          << band << ")";
    }
  }
  std::copy(gpu.begin() + first, gpu.begin() + first + n, routing->experts.begin());
}

}  // namespace k3
