// Small fp32 building blocks shared by the sequence mixers (KDA, MLA) and AttnRes: weight checks,
// the segments of a batched call (MixerSegment) and their checks, the KDA L2 norm, scalar
// activations, vector loops, and a reusable scratch area so that decode steps do not allocate.
// Products (Dot, DotRows, Gemm, Axpy, MatMulTransposed) are kernels/fp32_products.h and
// kernels/matmul.h; RMSNorm is kernels/rms_norm.h.
//
// The vector loops are compiled for several x86-64 levels and picked at load time
// (kernels/simd.h), so one binary uses AVX-512 where the CPU has it and still runs on a baseline
// x86-64.
//
// Thread-safety: the free functions are pure (they touch only their arguments). Scratch is not
// thread-safe: one per concurrent caller.
#ifndef K3SERVE_ATTENTION_NODES_FORWARD_LAYER_MATH_H_
#define K3SERVE_ATTENTION_NODES_FORWARD_LAYER_MATH_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "kernels/activation.h"
#include "kernels/matmul.h"

namespace k3 {

// Reusable float buffers indexed by a small slot number. A buffer only grows, so after the first
// calls of a given size, Get never allocates.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // Returns at least `n` floats for `slot`; the contents are unspecified. Buffers of different
  // slots never overlap. A pointer stays valid until the next Get of the same slot.
  float* Get(int slot, size_t n);
  // The same for integers (bookkeeping such as row offsets); a separate set of slots.
  int64_t* GetInts(int slot, size_t n);

  // Bytes currently held.
  size_t ByteSize() const;

 private:
  std::vector<std::vector<float>> buffers_;
  std::vector<std::vector<int64_t>> ints_;
};

// Shape checks of a mixer's weights: InvalidArgument naming `mixer` ("KDA", "MLA") and the
// weight. A negative rows or cols leaves that dimension unchecked.
absl::Status CheckWeightMatrix(const char* mixer, const WeightMatrix& m, int64_t rows,
                               int64_t cols, const char* name);
absl::Status CheckWeightVector(const char* mixer, const std::vector<float>& v, size_t size,
                               const char* name);

// One sequence's share of a mixer's batched call (KdaForwardBatch, MlaForwardBatch): `tokens`
// consecutive rows of x and out (after the rows of the segments before it), continuing that
// sequence's `state` for the layer (a KdaState; an MlaCache, which the new tokens attend to and are
// appended to). One sequence alone is a batch of one segment, e.g. {{&state, tokens}}.
template <typename State>
struct MixerSegment {
  State* state = nullptr;
  int64_t tokens = 0;
};

// Checks the segments of a mixer's batched call before anything runs: InvalidArgument naming
// `mixer` for a segment without its state (called `state_name`: "state", "cache") or with
// tokens < 0, else the first error of check_state(*state). Returns the segments' total tokens (the
// batch's rows).
template <typename State, typename CheckState>
absl::StatusOr<int64_t> CheckSegments(const char* mixer, const char* state_name,
                                      absl::Span<const MixerSegment<State>> segments,
                                      const CheckState& check_state) {
  int64_t rows = 0;
  for (const MixerSegment<State>& segment : segments) {
    if (segment.state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(mixer, " segment without a ", state_name));
    }
    if (segment.tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(mixer, " segment tokens ", segment.tokens, " < 0"));
    }
    K3_RETURN_IF_ERROR(check_state(*segment.state));
    rows += segment.tokens;
  }
  return rows;
}

// x = scale · x / sqrt(Σ x² + 1e-6) (spec §3.3; the ε sits inside the root, on the sum).
void L2NormalizeInPlace(float* x, int64_t dim, float scale);

// x *= alpha.
void Scale(float alpha, float* x, int64_t n);
// y += a ⊙ b.
void MulAdd(const float* a, const float* b, float* y, int64_t n);

// Elementwise, in place, vectorized (the exponential is accurate to about 2 ulp):
void ExpInPlace(float* x, int64_t n);                     // x = e^x
// x = e^(x - shift); returns the sum of the new x (the running sum of an online softmax).
// REQUIRES: shift is finite (-inf entries of x then give 0).
float ExpShiftedSum(float* x, int64_t n, float shift);
// The largest element (-inf for n == 0; NaNs are not expected).
float MaxOf(const float* x, int64_t n);
void SiluInPlace(float* x, int64_t n);                    // x = x σ(x)
void MulSigmoid(const float* gate, float* x, int64_t n);  // x *= σ(gate)

}  // namespace k3

#endif  // K3SERVE_ATTENTION_NODES_FORWARD_LAYER_MATH_H_
