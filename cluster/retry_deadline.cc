#include "cluster/retry_deadline.h"

#include <algorithm>

namespace k3 {
namespace {

constexpr size_t kWindow = 512;
constexpr size_t kRecomputeEvery = 32;
constexpr size_t kMinRoundTrips = 32;

}  // namespace

RetryDeadline::RetryDeadline(absl::Duration floor, double p99_factor)
    : floor_(floor), p99_factor_(p99_factor), deadline_(floor) {}

void RetryDeadline::Record(absl::Duration round_trip) {
  if (round_trips_.size() < kWindow) {
    round_trips_.push_back(round_trip);
  } else {
    round_trips_[next_ % kWindow] = round_trip;
  }
  ++next_;
  if (round_trips_.size() < kMinRoundTrips || next_ % kRecomputeEvery != 0) return;
  std::vector<absl::Duration> sorted = round_trips_;
  const size_t p99 = sorted.size() * 99 / 100;
  std::nth_element(sorted.begin(), sorted.begin() + p99, sorted.end());
  deadline_ = std::max(floor_, sorted[p99] * p99_factor_);
}

}  // namespace k3
