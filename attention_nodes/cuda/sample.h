// Token sampling on a GPU: the GPU twin of attention_nodes/sampler.h's Sampler::Next without a
// constraint. For each row of logits: greedy (temperature 0: the highest logit, ties to the lower
// id), or a draw from softmax(logits / temperature) over the top_k highest logits (0: all), cut to
// the smallest set of most likely tokens whose mass reaches top_p, by inverse CDF in the CPU's
// order (higher logit first, ties to the lower id) at the row's uniform number. The uniform number
// is drawn on the host from the sequence's seeded generator exactly as the CPU sampler draws it
// (SampleUniform), so with the same seed both pick the same tokens, up to double rounding at a
// boundary. Constrained sequences (a logits mask) are sampled on the host.
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned.
#ifndef K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_H_
#define K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_H_

#include <cstdint>
#include <random>

namespace k3 {

// The CPU sampler's draw: 53 random bits of the sequence's generator as a double in [0, 1).
inline double SampleUniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// One row's sampling parameters (SamplingOptions, checked by ValidateSamplingOptions).
struct DeviceSamplingRow {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  double uniform = 0.0;  // in [0, 1): SampleUniform; unused when temperature is 0
};

// logits: [rows, vocab] with row stride `stride`; rows_params: [rows]; tokens: [rows] out, each the
// sampled id, or -1 where the row holds a NaN or an infinity (no token may be drawn from it; the
// caller reports it as CheckLogitsFinite does). Enqueues one launch on `stream` (a cudaStream_t;
// nullptr for the legacy stream) and returns its cudaError_t (0: enqueued); rows < 1, vocab < 1
// or a stride below vocab returns cudaErrorInvalidValue (1) with nothing enqueued.
//
// Not yet fast: each of up to three searches (top_k, top_p, the draw) takes 64 passes over the
// row (the bits of a 64-bit rank key), recomputing the probabilities in double.
int LaunchSample(const float* logits, int64_t stride, int32_t rows, int32_t vocab,
                 const DeviceSamplingRow* row_params, int32_t* tokens, void* stream);

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_CUDA_SAMPLE_H_
