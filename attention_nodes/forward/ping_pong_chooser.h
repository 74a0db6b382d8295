// PingPongChooser: whether a step runs as one batch or as two ping-pong micro-batches, chosen by
// measurement. Ping-pong pays where the router and expert tiers have cores of their own to serve
// one micro-batch while the attention worker computes the other (separate hosts or GPUs); where
// every tier shares a few cores, it only doubles the MoE messages (a local k3-tiny cluster on 2
// cores decodes 8 streams ~25% slower with it). So both are timed on the steps as they come.
//
// Steps are grouped by row count (powers of two). Within a group, each way is tried kTrials times
// (alternating), then the one with the lower mean time per row is used, and every kExploreEvery-th
// step of the group tries the other again, so that a change (a context grown longer, a busier
// host) is noticed. Means are exponential (weight kWeight for the newest step).
//
// Thread-safety: not thread-safe; the stepping thread owns it.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_PING_PONG_CHOOSER_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_PING_PONG_CHOOSER_H_

#include <cstdint>
#include <map>

#include "absl/time/time.h"

namespace k3 {

class PingPongChooser {
 public:
  static constexpr int kTrials = 3;
  static constexpr int kExploreEvery = 32;
  static constexpr double kWeight = 0.5;

  // Whether the next step of `rows` rows should run as two micro-batches.
  bool Choose(int64_t rows);
  // The time of a step of `rows` rows that ran as chosen (`ping_pong`).
  void Record(int64_t rows, bool ping_pong, absl::Duration step);

 private:
  struct Way {
    int trials = 0;
    double seconds_per_row = 0;
  };
  struct Group {
    Way ways[2];  // [0]: one batch, [1]: ping-pong
    int64_t steps = 0;
  };
  static int GroupOf(int64_t rows);

  std::map<int, Group> groups_;
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_PING_PONG_CHOOSER_H_
