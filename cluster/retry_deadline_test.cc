#include "cluster/retry_deadline.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(RetryDeadlineTest, FloorUntilEnoughRoundTrips) {
  RetryDeadline deadline(absl::Milliseconds(5), 8);
  for (int i = 0; i < 31; ++i) deadline.Record(absl::Seconds(1));
  EXPECT_EQ(deadline.deadline(), absl::Milliseconds(5));
  deadline.Record(absl::Seconds(1));  // the 32nd: recomputed
  EXPECT_EQ(deadline.deadline(), absl::Seconds(8));
}

TEST(RetryDeadlineTest, NeverBelowTheFloor) {
  RetryDeadline deadline(absl::Milliseconds(300), 8);
  for (int i = 0; i < 64; ++i) deadline.Record(absl::Microseconds(100));
  EXPECT_EQ(deadline.deadline(), absl::Milliseconds(300));
}

// The deadline is the factor times the 99th percentile (element n * 99 / 100 in sorted order),
// computed here by sorting.
TEST(RetryDeadlineTest, FactorTimesThe99thPercentile) {
  RetryDeadline deadline(absl::Nanoseconds(1), 3);
  std::vector<absl::Duration> seen;
  for (int i = 0; i < 320; ++i) {
    const absl::Duration d = absl::Microseconds((i * 7919) % 1000 + 1);
    seen.push_back(d);
    deadline.Record(d);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(deadline.deadline(), seen[seen.size() * 99 / 100] * 3);
}

// Only the last 512 round trips count: after slow ones come 512 fast ones, the deadline falls.
TEST(RetryDeadlineTest, ForgetsOldRoundTrips) {
  RetryDeadline deadline(absl::Microseconds(1), 2);
  for (int i = 0; i < 512; ++i) deadline.Record(absl::Milliseconds(100));
  EXPECT_EQ(deadline.deadline(), absl::Milliseconds(200));
  for (int i = 0; i < 512; ++i) deadline.Record(absl::Milliseconds(1));
  EXPECT_EQ(deadline.deadline(), absl::Milliseconds(2));
}

}  // namespace
}  // namespace k3
