#include "attention_nodes/forward/ping_pong_chooser.h"

#include <bit>

namespace k3 {

int PingPongChooser::GroupOf(int64_t rows) {
  return rows <= 1 ? 0 : std::bit_width(static_cast<uint64_t>(rows - 1));
}

bool PingPongChooser::Choose(int64_t rows) {
  Group& group = groups_[GroupOf(rows)];
  const Way& single = group.ways[0];
  const Way& ping_pong = group.ways[1];
  if (single.trials < kTrials || ping_pong.trials < kTrials) {
    return ping_pong.trials < single.trials;  // alternate, one batch first
  }
  const bool better = ping_pong.seconds_per_row < single.seconds_per_row;
  const bool explore = group.steps % kExploreEvery == kExploreEvery - 1;
  return explore ? !better : better;
}

void PingPongChooser::Record(int64_t rows, bool ping_pong, absl::Duration step) {
  if (rows <= 0) return;
  Group& group = groups_[GroupOf(rows)];
  ++group.steps;
  Way& way = group.ways[ping_pong ? 1 : 0];
  const double seconds_per_row = absl::ToDoubleSeconds(step) / static_cast<double>(rows);
  way.seconds_per_row = way.trials == 0 ? seconds_per_row
                                        : (1 - kWeight) * way.seconds_per_row +
                                              kWeight * seconds_per_row;
  ++way.trials;
}

}  // namespace k3
