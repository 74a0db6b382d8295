// Test-only: holds a CPU engine's routing to a GPU engine's, so that the two are compared on
// numerics with the same experts, and checks the routing apart (engine/gpu_engine_test.cc,
// engine/gpu_step_runner_test.cc).
//
// The GPU rounds the rows entering its products (the router's too, on the device path) to bf16,
// so its gate's inputs differ from the CPU's by ~1e-3 relative, and an expert whose choice
// (score + bias) is that close to the token's k-th best can be swapped for its neighbour; one
// swapped expert moves that position's logits by several percent. So: Record the GPU's ids,
// layer by layer, as it runs; Replayer gives them to the CPU's LocalRoutedMoe in the same order
// (which recomputes the weights from the CPU's own scores), counting every GPU expert the CPU
// would not have chosen and checking that each is a near tie on the CPU: its choice within
// band = row_error x 1/4 x (the token's largest |gate logit|) of the CPU's k-th best. Why: the
// GPU's gate logits differ from the CPU's by at most the rows' relative error (`row_error`, which
// the caller bounds by its logit bound, since that covers every earlier layer) times Σ|w x|,
// itself within the largest |logit| for these random weights, and a sigmoid's slope is <= 1/4.
//
// Rows are matched by order: per layer, the recorded rows in call order are given to the CPU in
// its call order, so both must see the same rows in the same order (one sequence from position 0
// with any step sizes, or the same batches). Not thread-safe.
#ifndef K3SERVE_ENGINE_HELD_ROUTING_TESTING_H_
#define K3SERVE_ENGINE_HELD_ROUTING_TESTING_H_

#include <cstdint>
#include <map>
#include <vector>

#include "engine/local_routed_moe.h"
#include "model/weights.h"

namespace k3 {

class HeldRouting {
 public:
  // `weights` (the CPU engine's: for the score biases) must outlive this object.
  HeldRouting(const ModelWeights* weights, double row_error)
      : weights_(weights), row_error_(row_error) {}

  // Forgets what was recorded and replayed: a new comparison.
  void Reset();
  // The GPU's chosen experts of one call of MoE layer `layer`, [rows, top_k].
  void Record(int layer, const std::vector<int32_t>& ids);
  // The CPU side's LocalRoutedMoe hook (see the file comment); valid while this object lives.
  LocalRoutedMoe::RoutingHook Replayer();

  int64_t slots() const { return slots_; }  // expert slots replayed
  int64_t swaps() const { return swaps_; }  // of which the CPU would have chosen another expert
  // Prints "what: routing agreement N/M expert slots".
  void Print(const char* what) const;

 private:
  void Replay(int layer, Routing* routing);

  const ModelWeights* weights_;
  double row_error_;
  std::map<int, std::vector<int32_t>> recorded_;
  std::map<int, size_t> read_;
  int64_t slots_ = 0, swaps_ = 0;
};

}  // namespace k3

#endif  // K3SERVE_ENGINE_HELD_ROUTING_TESTING_H_
