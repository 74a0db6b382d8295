#include "http_front/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace k3 {

StopMatcher::StopMatcher(std::vector<std::string> stops)
    : stops_([&] {
        stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
        return std::move(stops);
      }()) {}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  // The earliest complete stop string ends the text.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string. It is shorter than the
  // longest stop string, so this costs O(stop length^2) per piece, whatever the text's length.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > keep; --n) {
      if (std::string_view(pending_).substr(pending_.size() - n) ==
          std::string_view(stop).substr(0, n)) {
        keep = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopMatcher::Finish() {
  std::string out = stopped_ ? "" : std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace k3
