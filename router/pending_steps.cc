#include "router/pending_steps.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace k3 {

void PendingSteps::Add(std::unique_ptr<PendingStep> step) {
  CHECK_GT(step->outstanding, 0) << "a pending step must wait for an answer";
  const uint64_t id = step->id;
  const bool inserted = steps_.emplace(id, std::move(step)).second;
  CHECK(inserted) << "step " << id << " is already pending";
}

void PendingStep::AddSlot() {
  nodes.push_back(0);
  answers.emplace_back();
  partial_at.push_back(0);
  answered.push_back(false);
}

const float* PendingStep::Partial(size_t slot) const {
  if (answers[slot].empty()) return nullptr;
  return reinterpret_cast<const float*>(answers[slot].data() + partial_at[slot]);
}

PendingSteps::Answer PendingSteps::OnAnswer(PeerId node, MessageBytes message) {
  Answer answer;
  ExpertResponse response;
  absl::Span<const float> partial;
  if (absl::Status decoded = DecodeInPlace(message, &response, &partial); !decoded.ok()) {
    // Decode reads the step id first: the answer may still name its slot.
    response.status = absl::InternalError(absl::StrCat("malformed answer: ", decoded.message()));
  }
  auto it = steps_.find(response.step_id >> kSlotBits);
  if (it == steps_.end()) return answer;
  PendingStep& step = *it->second;
  const size_t slot = static_cast<size_t>(response.step_id & (kMaxSlots - 1));
  if (slot >= step.nodes.size() || step.nodes[slot] == 0 || step.answered[slot]) return answer;

  const int64_t rows = static_cast<int64_t>(step.step.plan.workers[slot].tokens.size());
  if (!response.status.ok()) {
    answer.error = response.status;
  } else if (response.rows_count != rows || response.width != step.step.width) {
    answer.error = absl::InternalError(
        absl::StrCat("answered ", response.rows_count, " rows of width ", response.width,
                     " for ", rows, " rows of width ", step.step.width));
  }
  if (!answer.error.ok()) {
    // The slot's former node speaks for rows it no longer holds: the current one may still answer.
    if (node != step.nodes[slot]) return answer;
    answer.outcome = Outcome::kFailed;
    answer.step = std::move(it->second);
    steps_.erase(it);
    return answer;
  }
  step.partial_at[slot] =
      static_cast<size_t>(reinterpret_cast<const char*>(partial.data()) - message.data());
  step.answers[slot] = std::move(message);
  step.answered[slot] = true;
  if (--step.outstanding > 0) {
    answer.outcome = Outcome::kWaiting;
    return answer;
  }
  answer.outcome = Outcome::kComplete;
  answer.step = std::move(it->second);
  steps_.erase(it);
  return answer;
}

std::vector<PeerId> PendingSteps::Unanswered(const PendingStep& step) {
  std::set<PeerId> nodes;
  for (size_t w = 0; w < step.nodes.size(); ++w) {
    if (step.nodes[w] != 0 && !step.answered[w]) nodes.insert(step.nodes[w]);
  }
  return std::vector<PeerId>(nodes.begin(), nodes.end());
}

std::vector<std::unique_ptr<PendingStep>> PendingSteps::TakeWaitingOn(PeerId node) {
  std::vector<std::unique_ptr<PendingStep>> taken;
  for (auto it = steps_.begin(); it != steps_.end();) {
    const std::vector<PeerId> owing = Unanswered(*it->second);
    if (std::find(owing.begin(), owing.end(), node) != owing.end()) {
      taken.push_back(std::move(it->second));
      it = steps_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

std::vector<std::unique_ptr<PendingStep>> PendingSteps::TakeExpired(absl::Time now) {
  std::vector<std::unique_ptr<PendingStep>> taken;
  for (auto it = steps_.begin(); it != steps_.end();) {
    if (it->second->deadline <= now) {
      taken.push_back(std::move(it->second));
      it = steps_.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

std::vector<std::unique_ptr<PendingStep>> PendingSteps::TakeAll() {
  std::vector<std::unique_ptr<PendingStep>> taken;
  for (auto& [id, step] : steps_) taken.push_back(std::move(step));
  steps_.clear();
  return taken;
}

std::vector<PeerId> PendingSteps::AwaitedNodes() const {
  std::set<PeerId> nodes;
  for (const auto& [id, step] : steps_) {
    for (PeerId node : Unanswered(*step)) nodes.insert(node);
  }
  return std::vector<PeerId>(nodes.begin(), nodes.end());
}

absl::Time PendingSteps::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, step] : steps_) next = std::min(next, step->deadline);
  return next;
}

}  // namespace k3
