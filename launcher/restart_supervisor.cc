#include "launcher/restart_supervisor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::Status RestartPolicy::Validate() const {
  if (initial_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("initial_backoff must not be negative");
  }
  if (max_backoff < initial_backoff) {
    return absl::InvalidArgumentError("max_backoff must be at least initial_backoff");
  }
  if (healthy_run < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("healthy_run must not be negative");
  }
  if (max_failures_in_a_row < 0) {
    return absl::InvalidArgumentError("max_failures_in_a_row must not be negative");
  }
  return absl::OkStatus();
}

std::string DescribeExitStatus(int exit_status) {
  return exit_status > 128 ? absl::StrCat("killed by signal ", exit_status - 128)
                           : absl::StrCat("exit status ", exit_status);
}

void RestartSupervisor::Started(const std::string& node, absl::Time now) {
  NodeState& state = nodes_[node];
  state.started = now;
  state.restart_at = absl::InfiniteFuture();
}

RestartSupervisor::Decision RestartSupervisor::Exited(const std::string& node, int exit_status,
                                                      absl::Time now) {
  NodeState& state = nodes_[node];
  if (now - state.started >= policy_.healthy_run) state.failures_in_a_row = 0;
  ++state.failures_in_a_row;
  state.restart_at = absl::InfiniteFuture();
  Decision decision;
  decision.attempt = state.failures_in_a_row;
  const std::string exit = DescribeExitStatus(exit_status);
  if (state.failures_in_a_row > policy_.max_failures_in_a_row) {
    decision.give_up = true;
    decision.message =
        policy_.max_failures_in_a_row == 0
            ? absl::StrCat(node, " died (exit: ", exit, ") and restarts are off")
            : absl::StrCat(node, " died again (exit: ", exit, ") after ",
                           policy_.max_failures_in_a_row, " restarts in a row, none of which ran ",
                           absl::FormatDuration(policy_.healthy_run), "; giving up");
    return decision;
  }
  absl::Duration delay = policy_.initial_backoff;
  for (int i = 1; i < state.failures_in_a_row && delay < policy_.max_backoff; ++i) delay *= 2;
  decision.delay = std::min(delay, policy_.max_backoff);
  decision.due = now + decision.delay;
  state.restart_at = decision.due;
  decision.message = absl::StrCat("restarting ", node, " (exit: ", exit, "), attempt ",
                                  decision.attempt, " in ",
                                  absl::ToInt64Milliseconds(decision.delay), " ms");
  return decision;
}

std::vector<std::string> RestartSupervisor::TakeDue(absl::Time now) {
  std::vector<std::string> due;
  for (auto& [name, state] : nodes_) {
    if (state.restart_at != absl::InfiniteFuture() && state.restart_at <= now) {
      due.push_back(name);
      state.restart_at = absl::InfiniteFuture();
    }
  }
  return due;
}

absl::Time RestartSupervisor::NextDue() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [name, state] : nodes_) next = std::min(next, state.restart_at);
  return next;
}

}  // namespace k3
