#include "attention_nodes/forward/ping_pong_chooser.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Runs `steps` steps of `rows` rows; a step takes `single` or `ping_pong` per row as chosen.
// Returns how many ran as ping-pong.
int RunSteps(PingPongChooser& chooser, int steps, int64_t rows, absl::Duration single,
        absl::Duration ping_pong) {
  int chosen = 0;
  for (int i = 0; i < steps; ++i) {
    const bool pp = chooser.Choose(rows);
    chosen += pp ? 1 : 0;
    chooser.Record(rows, pp, (pp ? ping_pong : single) * rows);
  }
  return chosen;
}

TEST(PingPongChooserTest, TriesBothThenKeepsTheFasterExploringRarely) {
  PingPongChooser chooser;
  // Trials: both ways kTrials times, alternating from one batch.
  EXPECT_FALSE(chooser.Choose(8));
  chooser.Record(8, false, absl::Milliseconds(8));
  EXPECT_TRUE(chooser.Choose(8));
  chooser.Record(8, true, absl::Milliseconds(4));
  // Ping-pong at half the time per row wins: after the trials, only exploration steps are not it.
  const int steps = 4 * PingPongChooser::kExploreEvery;
  const int ping_pong =
      RunSteps(chooser, steps, 8, absl::Milliseconds(1), absl::Microseconds(500));
  EXPECT_GE(ping_pong, steps - 4 - 2 * PingPongChooser::kTrials);
  EXPECT_LT(ping_pong, steps);  // it did look at one batch again
}

TEST(PingPongChooserTest, SwitchesWhenTheOtherWayBecomesFaster) {
  PingPongChooser chooser;
  RunSteps(chooser, 64, 16, absl::Milliseconds(1), absl::Milliseconds(2));  // one batch wins
  EXPECT_FALSE(chooser.Choose(16));
  // Now ping-pong is faster (say, the expert tier moved to hosts of its own): exploration steps
  // see it, and the means follow.
  const int later = RunSteps(chooser, 8 * PingPongChooser::kExploreEvery, 16, absl::Milliseconds(1),
                        absl::Microseconds(400));
  EXPECT_GT(later, 5 * PingPongChooser::kExploreEvery);
  EXPECT_TRUE(chooser.Choose(16));
}

TEST(PingPongChooserTest, StepSizesAreJudgedApart) {
  PingPongChooser chooser;
  // Small steps are faster in one batch, large ones in two micro-batches.
  RunSteps(chooser, 64, 4, absl::Milliseconds(1), absl::Milliseconds(3));
  RunSteps(chooser, 64, 200, absl::Milliseconds(3), absl::Milliseconds(1));
  EXPECT_FALSE(chooser.Choose(4));
  EXPECT_FALSE(chooser.Choose(3));    // the same group as 4
  EXPECT_TRUE(chooser.Choose(200));
  EXPECT_FALSE(chooser.Choose(1000));  // a new group: trials start with one batch
}

}  // namespace
}  // namespace k3
