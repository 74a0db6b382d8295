// RetryDeadline: how long to wait for a peer's answer before sending the work elsewhere, learnt
// from the answers so far: max(floor, p99_factor x the 99th percentile of the last 512 round
// trips). Until 32 round trips are known it is the floor. Used by the attention worker (a MoE
// layer sent to a router) and the router (rows sent to an expert worker): a peer that answers
// late is treated as lost only well past what answers normally take, and a slow but steady
// cluster does not resend work it will get answered anyway.
//
// Not thread-safe: the owner serializes calls (its own thread or lock).
#ifndef K3SERVE_CLUSTER_RETRY_DEADLINE_H_
#define K3SERVE_CLUSTER_RETRY_DEADLINE_H_

#include <cstddef>
#include <vector>

#include "absl/time/time.h"

namespace k3 {

class RetryDeadline {
 public:
  // REQUIRES: floor > 0, p99_factor >= 1.
  RetryDeadline(absl::Duration floor, double p99_factor);

  // Adds an answered round trip; the deadline is recomputed every 32 of them.
  void Record(absl::Duration round_trip);

  absl::Duration deadline() const { return deadline_; }

 private:
  const absl::Duration floor_;
  const double p99_factor_;
  std::vector<absl::Duration> round_trips_;  // a ring of the last kWindow round trips
  size_t next_ = 0;                          // total recorded; next_ % kWindow is the oldest
  absl::Duration deadline_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_RETRY_DEADLINE_H_
