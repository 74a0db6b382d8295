#include "kernels/gated_mlp.h"

#include "kernels/thread_pool.h"

namespace k3 {

void GatedMlp(const GatedMlpMatrices& w, const GluParams& params, const float* x, int64_t tokens,
              float* y, bool accumulate, std::vector<float>* scratch) {
  const int64_t width = w.gate.rows;
  // gate and up side by side, [tokens, 2 * width], so one buffer serves both products.
  scratch->resize(static_cast<size_t>(tokens * 2 * width));
  float* gate_up = scratch->data();
  const MatMulTask gate_and_up[2] = {{&w.gate, x, w.gate.cols, gate_up, 2 * width, false},
                                     {&w.up, x, w.up.cols, gate_up + width, 2 * width, false}};
  MatMulBatch(gate_and_up, 2, tokens);
  ParallelFor(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = gate_up + t * 2 * width;
      for (int64_t i = 0; i < width; ++i) row[i] = GluCombine(params, row[i], row[width + i]);
    }
  });
  MatMul(w.down, gate_up, 2 * width, tokens, y, w.down.rows, accumulate);
}

}  // namespace k3
