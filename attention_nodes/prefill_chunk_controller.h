// PrefillChunkController: how many prompt tokens a scheduler step may prefill while other
// sequences are decoding, so that a long prompt does not stall their inter-token latency.
//
// It learns two things from the steps the scheduler reports (ObserveStep):
//   - the decode-only step time: an exponential moving average over steps without prefill
//     (before one has been seen, over steps whose prefill was at most `min_chunk`);
//   - the time a prefill token adds to a step: (step time - decode-only time) / prefill tokens of
//     the last step with prefill, smoothed the same way. It grows with the prompt's position (MLA
//     attends over the whole prefix), which is why it is re-measured every step.
// The target step time is `target_factor` x the decode-only time (never below `min_target`).
// ChunkTokens(true) is the chunk whose predicted step time meets the target, limited to half or
// 1.25x the previous chunk (no oscillation on a noisy step; at least one more token, or one more
// granule once the chunk is a granule or more), to [min_chunk, max_chunk], and
// rounded down to a multiple of `granule` (min_chunk at least). Before anything is measured it is
// min_chunk. ChunkTokens(false) is max_chunk: without decoding sequences there is no latency to
// protect.
//
// The chunk only decides where a prompt is cut; chunked prefill gives the same tokens whatever
// the cuts (up to batched-product rounding), so the controller changes latency, not results.
//
// Deterministic: it reads no clock; the caller passes measured durations. Not thread-safe (the
// scheduler thread owns it).
#ifndef K3SERVE_ATTENTION_NODES_PREFILL_CHUNK_CONTROLLER_H_
#define K3SERVE_ATTENTION_NODES_PREFILL_CHUNK_CONTROLLER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace k3 {

struct PrefillChunkOptions {
  int64_t min_chunk = 16;      // floor: a long prompt always progresses
  int64_t max_chunk = 2048;    // ceiling: the step's token budget
  int64_t granule = 16;        // chunks are multiples of this (KDA's chunk, kKdaChunk)
  double target_factor = 1.5;  // target step time / decode-only step time
  absl::Duration min_target = absl::ZeroDuration();
  double smoothing = 0.5;  // weight of the newest measurement in the moving averages, (0, 1]

  // INVALID_ARGUMENT naming the first field out of range.
  absl::Status Validate() const;
};

class PrefillChunkController {
 public:
  // REQUIRES: options.Validate() is OK (CHECK-fails otherwise).
  explicit PrefillChunkController(const PrefillChunkOptions& options);

  // Prompt tokens the next step may prefill (all prompts together).
  int64_t ChunkTokens(bool decoding) const;

  // Reports a finished step: its decode tokens, prefill tokens and wall time.
  void ObserveStep(int64_t decode_tokens, int64_t prefill_tokens, absl::Duration step_time);

  // What it has learnt; zero before the first measurement.
  absl::Duration decode_step_time() const { return decode_step_; }
  absl::Duration target_step_time() const;
  absl::Duration per_prefill_token() const { return per_token_; }

 private:
  int64_t Clamp(int64_t chunk) const;

  const PrefillChunkOptions options_;
  absl::Duration decode_step_ = absl::ZeroDuration();
  bool decode_only_seen_ = false;
  absl::Duration per_token_ = absl::ZeroDuration();
  int64_t chunk_;  // the chunk ChunkTokens(true) returns
};

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_PREFILL_CHUNK_CONTROLLER_H_
