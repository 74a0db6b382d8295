#include "attention_nodes/prefill_chunk_controller.h"

#include <algorithm>

#include "glog/logging.h"

namespace k3 {

absl::Status PrefillChunkOptions::Validate() const {
  if (granule < 1) return absl::InvalidArgumentError("granule must be >= 1");
  if (min_chunk < 1) return absl::InvalidArgumentError("min_chunk must be >= 1");
  if (max_chunk < min_chunk) return absl::InvalidArgumentError("max_chunk must be >= min_chunk");
  if (!(target_factor >= 1.0)) return absl::InvalidArgumentError("target_factor must be >= 1");
  if (min_target < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("min_target must be >= 0");
  }
  if (!(smoothing > 0.0 && smoothing <= 1.0)) {
    return absl::InvalidArgumentError("smoothing must lie in (0, 1]");
  }
  return absl::OkStatus();
}

PrefillChunkController::PrefillChunkController(const PrefillChunkOptions& options)
    : options_(options), chunk_(options.min_chunk) {
  const absl::Status valid = options_.Validate();
  CHECK(valid.ok()) << valid;
}

int64_t PrefillChunkController::ChunkTokens(bool decoding) const {
  return decoding ? chunk_ : options_.max_chunk;
}

absl::Duration PrefillChunkController::target_step_time() const {
  return std::max(decode_step_ * options_.target_factor, options_.min_target);
}

int64_t PrefillChunkController::Clamp(int64_t chunk) const {
  chunk = std::clamp(chunk, options_.min_chunk, options_.max_chunk);
  if (chunk >= options_.granule) chunk -= chunk % options_.granule;
  return std::max(chunk, options_.min_chunk);
}

void PrefillChunkController::ObserveStep(int64_t decode_tokens, int64_t prefill_tokens,
                                         absl::Duration step_time) {
  const double a = options_.smoothing;
  auto blend = [a](absl::Duration old, absl::Duration now, bool first) {
    return first ? now : old * (1.0 - a) + now * a;
  };
  if (decode_tokens == 0) return;  // nothing to protect; says nothing about decoding
  if (prefill_tokens == 0) {
    decode_step_ = blend(decode_step_, step_time, !decode_only_seen_);
    decode_only_seen_ = true;
    return;
  }
  if (!decode_only_seen_) {
    if (prefill_tokens > options_.min_chunk) return;
    // A floor-sized chunk costs about what a decode-only step does (both read every weight
    // once); it stands in until a decode-only step is seen.
    decode_step_ = blend(decode_step_, step_time, decode_step_ == absl::ZeroDuration());
  }
  const absl::Duration extra =
      std::max(step_time - decode_step_, absl::Nanoseconds(1)) / prefill_tokens;
  per_token_ = blend(per_token_, extra, per_token_ == absl::ZeroDuration());
  const absl::Duration room = target_step_time() - decode_step_;
  const double fit = absl::FDivDuration(room, per_token_);
  const int64_t wanted = room <= absl::ZeroDuration() ? options_.min_chunk
                         : fit >= static_cast<double>(options_.max_chunk)
                             ? options_.max_chunk
                             : static_cast<int64_t>(fit);
  // Grow by a quarter (at least a token, or a granule once chunks are granule multiples): a
  // step's prefill tokens can be cheaper than the next step's (a short prompt beside a long
  // one's tail), and doubling on such a step overshoots the target twofold.
  const int64_t step = chunk_ < options_.granule ? 1 : options_.granule;
  const int64_t most = std::max(chunk_ + step, chunk_ + chunk_ / 4);
  chunk_ = Clamp(std::clamp(wanted, chunk_ / 2, most));
}

}  // namespace k3
