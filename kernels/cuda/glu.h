// The elementwise steps around the GPU layers' cuBLAS products (the twins of kernels/bf16.h's
// FloatToBf16, kernels/gated_mlp.h's GluCombine and attention_nodes/forward/layer_math.h's
// MulSigmoid): activations rounded to bf16 for the tensor cores, a gated MLP's hidden = act(gate) ⊙
// cap(up) written as bf16 for the down product, and a sigmoid output gate.
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer; nothing is owned. Each function
// enqueues one launch on `stream` (a cudaStream_t; nullptr for the legacy stream) and returns its
// cudaError_t (0: enqueued); for the row functions (any number of rows), rows < 1, width < 1 or a
// stride below the width returns cudaErrorInvalidValue (1) with nothing enqueued.
#ifndef K3SERVE_KERNELS_CUDA_GLU_H_
#define K3SERVE_KERNELS_CUDA_GLU_H_

#include <cstdint>

#include "kernels/glu_params.h"

namespace k3 {

// out[r, c] = bf16(x[r, c]), rounded to nearest even. x: fp32 [rows, width] with row stride
// x_stride; out: bf16 bits [rows, width] with row stride out_stride.
int LaunchRoundToBf16(const float* x, int64_t x_stride, int32_t rows, int32_t width, uint16_t* out,
                      int64_t out_stride, void* stream);

// hidden[r, c] = bf16(act(gate[r, c]) · cap(up[r, c])). gate, up: fp32 [rows, width] with row
// stride in_stride (both); hidden: bf16 bits [rows, width] with row stride hidden_stride.
int LaunchGluCombine(const GluParams& params, const float* gate, const float* up, int64_t in_stride,
                     int32_t rows, int32_t width, uint16_t* hidden, int64_t hidden_stride,
                     void* stream);

// x[i] *= σ(gate[i]) for i < n (the twin of attention_nodes/forward/layer_math.h's MulSigmoid:
// MLA's output gate). Both fp32, dense. n < 1 returns cudaErrorInvalidValue (1).
int LaunchMulSigmoid(const float* gate, float* x, int64_t n, void* stream);

}  // namespace k3

#endif  // K3SERVE_KERNELS_CUDA_GLU_H_
