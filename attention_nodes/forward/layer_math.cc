#include "attention_nodes/forward/layer_math.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <limits>

#include "glog/logging.h"
#include "kernels/rms_norm.h"
#include "kernels/simd.h"

namespace k3 {

absl::Status CheckWeightMatrix(const char* mixer, const WeightMatrix& m, int64_t rows,
                               int64_t cols, const char* name) {
  if (m.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(mixer, " weight ", name, " is missing"));
  }
  if ((rows >= 0 && m.rows != rows) || (cols >= 0 && m.cols != cols)) {
    return absl::InvalidArgumentError(absl::StrCat(mixer, " weight ", name, " is [", m.rows, ", ",
                                                   m.cols, "], expected [", rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckWeightVector(const char* mixer, const std::vector<float>& v, size_t size,
                               const char* name) {
  if (v.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(mixer, " weight ", name, " has ", v.size(), " values, expected ", size));
  }
  return absl::OkStatus();
}

using simd::kWidth;
using simd::Load;
using simd::Splat;
using simd::Store;
using simd::Vec16;

namespace {

// Scalar tails share the vector code's formulas, one lane at a time.
K3_SIMD_INLINE float ExpScalar(float x) {
  Vec16 v = Splat(x);
  return simd::Exp(v)[0];
}

// Scratch::Get and GetInts: slot `slot` of `buffers`, grown to at least n elements.
template <typename T>
T* GrowSlot(std::vector<std::vector<T>>& buffers, int slot, size_t n) {
  CHECK_GE(slot, 0);
  if (static_cast<size_t>(slot) >= buffers.size()) buffers.resize(slot + 1);
  std::vector<T>& buffer = buffers[slot];
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace

float* Scratch::Get(int slot, size_t n) { return GrowSlot(buffers_, slot, n); }

int64_t* Scratch::GetInts(int slot, size_t n) { return GrowSlot(ints_, slot, n); }

size_t Scratch::ByteSize() const {
  size_t bytes = 0;
  for (const std::vector<float>& buffer : buffers_) bytes += buffer.capacity() * sizeof(float);
  for (const std::vector<int64_t>& buffer : ints_) bytes += buffer.capacity() * sizeof(int64_t);
  return bytes;
}

void L2NormalizeInPlace(float* x, int64_t dim, float scale) {
  Scale(static_cast<float>(scale / std::sqrt(SumOfSquares(x, dim) + 1e-6)), x, dim);
}

K3_VECTOR_CLONES
void Scale(float alpha, float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(x + i, Load(x + i) * alpha);
  for (; i < n; ++i) x[i] *= alpha;
}

K3_VECTOR_CLONES
void MulAdd(const float* a, const float* b, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(y + i, Load(y + i) + Load(a + i) * Load(b + i));
  for (; i < n; ++i) y[i] += a[i] * b[i];
}

K3_VECTOR_CLONES
void ExpInPlace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Store(x + i, simd::Exp(Load(x + i)));
  for (; i < n; ++i) x[i] = ExpScalar(x[i]);
}

K3_VECTOR_CLONES
float ExpShiftedSum(float* x, int64_t n, float shift) {
  const Vec16 vs = Splat(shift);
  Vec16 total{};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const Vec16 e = simd::Exp(Load(x + i) - vs);
    Store(x + i, e);
    total += e;
  }
  float sum = simd::Sum(total);
  for (; i < n; ++i) {
    x[i] = ExpScalar(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

K3_VECTOR_CLONES
float MaxOf(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= kWidth) {
    Vec16 m = Load(x);
    for (i = kWidth; i + kWidth <= n; i += kWidth) {
      const Vec16 v = Load(x + i);
      m = v > m ? v : m;
    }
    for (int l = 0; l < kWidth; ++l) best = std::max(best, m[l]);
  }
  for (; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

K3_VECTOR_CLONES
void SiluInPlace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const Vec16 v = Load(x + i);
    Store(x + i, v / (1.0f + simd::Exp(-v)));
  }
  for (; i < n; ++i) x[i] = x[i] / (1.0f + ExpScalar(-x[i]));
}

K3_VECTOR_CLONES
void MulSigmoid(const float* gate, float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    Store(x + i, Load(x + i) / (1.0f + simd::Exp(-Load(gate + i))));
  }
  for (; i < n; ++i) x[i] = x[i] / (1.0f + ExpScalar(-gate[i]));
}

}  // namespace k3
