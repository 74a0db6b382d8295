// The fused KDA decode step (kda_decode.h). One block per (head, sequence); the block's threads
// form a [groups, K] grid over the head's state: thread (group, m) owns value column m of key rows
// [32 · group, 32 · group + 32) and keeps those 32 values in registers for the whole step, so the
// state is read once and written once (the step is bound by those bytes: 64 KiB per head at
// K = 128). A warp covers 32 consecutive columns of one row per load: 128 contiguous bytes.
#include "attention_nodes/cuda/kda_decode.h"

#include <cuda_runtime.h>

namespace k3 {
namespace {

constexpr int kRowsPerThread = 32;
constexpr int kMaxConvKernel = 8;

__device__ float SigmoidOf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ float SoftplusOf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One channel's causal conv over [cache; x_new] (taps oldest first, w[window] on x_new), then
// SiLU; the cache (stride `stride` between its rows) shifts by one and ends with x_new.
__device__ float ConvStep(float x_new, const float* w, int window, int64_t stride, float* cache) {
  float acc = 0.0f;
  for (int t = 0; t < window; ++t) acc += w[t] * cache[t * stride];
  acc += w[window] * x_new;
  for (int t = 0; t + 1 < window; ++t) cache[t * stride] = cache[(t + 1) * stride];
  if (window > 0) cache[(window - 1) * stride] = x_new;
  return acc * SigmoidOf(acc);
}

// At K = 128 two blocks of 512 threads share an SM (64 registers each, no spills: ptxas -v), so
// 64 warps, each with 32 loads in flight per lane, keep the memory busy while others reduce.
template <int kDim>
__global__ void __launch_bounds__(kDim * (kDim / kRowsPerThread), kDim == 128 ? 2 : 1)
    KdaDecodeKernel(const KdaDecodeLaunch p) {
  constexpr int kGroups = kDim / kRowsPerThread;
  const int head = blockIdx.x, b = blockIdx.y;
  const int64_t width = static_cast<int64_t>(p.heads) * kDim;  // P
  const int64_t slot = p.slots[b];
  const int window = p.conv_kernel - 1;

  __shared__ float q[kDim], k[kDim], v[kDim], decay[kDim], o[kDim];
  __shared__ float partial[kGroups][kDim];
  __shared__ float norms[3];  // 1/‖q‖·K^-1/2, 1/‖k‖, 1/rms(o)

  // 1. Short convolutions (spec §3.4), one channel per thread for q, k and v: the new input with
  //    the cached ones, SiLU; the channel's cache column shifts by one and takes the new raw input.
  for (int j = threadIdx.x; j < kDim; j += blockDim.x) {
    const int64_t c = head * kDim + j;
    float* cache = p.conv_cache + slot * 3 * window * width + c;
    q[j] = ConvStep(p.q[b * width + c], p.q_conv + c * p.conv_kernel, window, width, cache);
    cache += window * width;
    k[j] = ConvStep(p.k[b * width + c], p.k_conv + c * p.conv_kernel, window, width, cache);
    cache += window * width;
    v[j] = ConvStep(p.v[b * width + c], p.v_conv + c * p.conv_kernel, window, width, cache);
  }
  // 2. The per-key-row decay e^g (§5.3), one row per thread.
  if (threadIdx.x < kDim) {
    const int64_t c = head * kDim + threadIdx.x;
    const float a = expf(p.a_log[head]);
    const float z = p.decay[b * width + c] + p.dt_bias[c];
    const float g = p.has_lower_bound ? p.lower_bound * SigmoidOf(a * z) : -a * SoftplusOf(z);
    decay[threadIdx.x] = expf(g);
  }
  __syncthreads();
  // 3. L2 norms of q and k (§3.3: ε 1e-6 on the sum), by the first warp.
  if (threadIdx.x < 32) {
    float sq = 0.0f, sk = 0.0f;
    for (int j = threadIdx.x; j < kDim; j += 32) {
      sq += q[j] * q[j];
      sk += k[j] * k[j];
    }
    sq = WarpSum(sq);
    sk = WarpSum(sk);
    if (threadIdx.x == 0) {
      norms[0] = rsqrtf(static_cast<float>(kDim)) / sqrtf(sq + 1e-6f);
      norms[1] = 1.0f / sqrtf(sk + 1e-6f);
    }
  }
  __syncthreads();

  // 4. The delta rule on this thread's 32 rows of column m: S ← diag(e^g) S, then
  //    u = β (v − Sᵀk) (the column sums of the groups meet in shared memory), S ← S + k uᵀ,
  //    o = Sᵀq.
  const int m = threadIdx.x % kDim, group = threadIdx.x / kDim, row0 = group * kRowsPerThread;
  float* s = p.state + ((slot * p.heads + head) * kDim + row0) * kDim + m;
  const float q_scale = norms[0], k_scale = norms[1];
  float rows[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) rows[r] = s[r * kDim];
  float predicted = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    rows[r] *= decay[row0 + r];
    predicted += rows[r] * (k[row0 + r] * k_scale);
  }
  partial[group][m] = predicted;
  __syncthreads();
  predicted = 0.0f;
  for (int g = 0; g < kGroups; ++g) predicted += partial[g][m];
  const float beta = SigmoidOf(p.beta_logit[b * p.heads + head]);
  const float u = beta * (v[m] - predicted);
  __syncthreads();  // every thread has read partial
  float read = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    rows[r] += (k[row0 + r] * k_scale) * u;
    s[r * kDim] = rows[r];
    read += rows[r] * (q[row0 + r] * q_scale);
  }
  partial[group][m] = read;
  __syncthreads();

  // 5. Gated RMSNorm of o over the head (FusedRMSNormGated): o ⊙ o_norm / rms(o) ⊙ σ(gate).
  if (threadIdx.x < kDim) {
    float sum = 0.0f;
    for (int g = 0; g < kGroups; ++g) sum += partial[g][threadIdx.x];
    o[threadIdx.x] = sum;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float squares = 0.0f;
    for (int j = threadIdx.x; j < kDim; j += 32) squares += o[j] * o[j];
    squares = WarpSum(squares);
    if (threadIdx.x == 0) norms[2] = 1.0f / sqrtf(squares / kDim + p.eps);
  }
  __syncthreads();
  if (threadIdx.x < kDim) {
    const int64_t c = b * width + head * kDim + threadIdx.x;
    p.out[c] = o[threadIdx.x] * norms[2] * p.o_norm[threadIdx.x] * SigmoidOf(p.gate[c]);
  }
}

template <int kDim>
int Launch(const KdaDecodeLaunch& p, cudaStream_t stream) {
  const dim3 grid(p.heads, p.batch);
  KdaDecodeKernel<kDim><<<grid, kDim * (kDim / kRowsPerThread), 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchKdaDecode(const KdaDecodeLaunch& p, void* stream) {
  if (p.batch < 1 || p.batch > 65535 || p.heads < 1 || p.conv_kernel < 1 ||
      p.conv_kernel > kMaxConvKernel) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.head_dim) {
    case 32:
      return Launch<32>(p, s);
    case 64:
      return Launch<64>(p, s);
    case 128:
      return Launch<128>(p, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace k3
