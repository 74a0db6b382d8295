// Test-only: runs CUDA kernels' device code on the CPU, one std::thread per CUDA thread, so that a
// kernel's indexing, synchronization and fragment bookkeeping are checked where there is no GPU.
// Include it before a kernel's .inc; it defines what that code uses of CUDA: __global__,
// __device__, __shared__ (function statics: shared by a block's threads, so blocks run one after
// another), threadIdx/blockIdx/blockDim/gridDim, __syncthreads, __syncwarp, __shfl_xor_sync,
// __match_any_sync, __popc, atomicAdd on ints, isnan, __float_as_uint, bf16 pairs, uint4, and
// EmulatedMma16816, mma.sync.m16n8k16 (bf16 in, fp32 accumulate) over the fragments as the PTX
// ISA lays them out. Warp-wide calls (__syncwarp, the shuffles, __match_any_sync, the MMA) must be
// reached by all 32 lanes of the warp, as the kernels here do.
//
// It checks logic, not timing or memory-model corner cases: every thread of a block runs truly
// concurrently, so a missing __syncthreads can still go unnoticed. Not thread-safe: one RunGrid
// at a time.
#ifndef K3SERVE_KERNELS_CUDA_SIMT_EMULATION_H_
#define K3SERVE_KERNELS_CUDA_SIMT_EMULATION_H_

#include <algorithm>
#include <atomic>
#include <bit>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <math.h>  // ::isnan, as device code calls it
#include <memory>
#include <thread>
#include <vector>

#define K3_SIMT_EMULATION 1
#define __global__
#define __device__ inline
#define __forceinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct SimtDim3 {
  int x = 0, y = 0, z = 0;
};

namespace k3::simt {

inline thread_local SimtDim3 thread_index, block_index;
inline SimtDim3 block_dim, grid_dim;
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float> shuffle_slots;  // [warps, 32]
inline std::vector<int> match_slots;      // [warps, 32]

struct MmaFragments {
  uint32_t a[4], b[2];
};
inline std::vector<MmaFragments> mma_slots;  // [warps, 32]

// Runs `kernel` (a callable running one thread's code) over `grid` blocks of `block` threads.
inline void RunGrid(SimtDim3 grid, SimtDim3 block, const std::function<void()>& kernel) {
  grid_dim = grid;
  block_dim = block;
  const int threads = block.x, warps = (threads + 31) / 32;
  shuffle_slots.assign(warps * 32, 0.0f);
  match_slots.assign(warps * 32, 0);
  mma_slots.assign(warps * 32, MmaFragments{});
  for (int z = 0; z < grid.z; ++z) {
    for (int y = 0; y < grid.y; ++y) {
      for (int x = 0; x < grid.x; ++x) {
        block_barrier = std::make_unique<std::barrier<>>(threads);
        warp_barriers.clear();
        for (int w = 0; w < warps; ++w) {
          warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - 32 * w)));
        }
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t, x, y, z] {
            thread_index = SimtDim3{t, 0, 0};
            block_index = SimtDim3{x, y, z};
            kernel();
          });
        }
        for (std::thread& thread : pool) thread.join();
      }
    }
  }
}

inline void WarpBarrier() { warp_barriers[thread_index.x / 32]->arrive_and_wait(); }

inline uint16_t RoundToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (no NaNs here)
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16Half(uint32_t pair, int high) {
  const uint32_t u = (high ? pair >> 16 : pair & 0xffff) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace k3::simt

namespace k3 {
// kernels/cuda/device_bf16.cuh's conversion, for kernels that store bf16.
inline uint16_t DeviceFloatToBf16Bits(float value) { return simt::RoundToBf16(value); }
}  // namespace k3

#define threadIdx (::k3::simt::thread_index)
#define blockIdx (::k3::simt::block_index)
#define blockDim (::k3::simt::block_dim)
#define gridDim (::k3::simt::grid_dim)

inline void __syncthreads() { k3::simt::block_barrier->arrive_and_wait(); }
inline void __syncwarp() { k3::simt::WarpBarrier(); }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
  const int lane = threadIdx.x % 32, base = threadIdx.x - lane;
  k3::simt::shuffle_slots[threadIdx.x] = value;
  k3::simt::WarpBarrier();
  const float other = k3::simt::shuffle_slots[base + (lane ^ lane_mask)];
  k3::simt::WarpBarrier();
  return other;
}

// The lanes of the calling warp whose `value` equals this lane's.
inline unsigned __match_any_sync(unsigned, int value) {
  const int lane = threadIdx.x % 32, base = threadIdx.x - lane;
  k3::simt::match_slots[threadIdx.x] = value;
  k3::simt::WarpBarrier();
  unsigned mask = 0;
  for (int l = 0; l < 32; ++l) mask |= k3::simt::match_slots[base + l] == value ? 1u << l : 0u;
  k3::simt::WarpBarrier();
  return mask;
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int atomicAdd(int* address, int value) {
  return std::atomic_ref<int>(*address).fetch_add(value);
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int min(int a, int b) { return std::min(a, b); }

struct __nv_bfloat162 {
  uint16_t x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {k3::simt::RoundToBf16(lo), k3::simt::RoundToBf16(hi)};
}

struct uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling warp. Lane 4g + t holds
// A {row g, k 2t..2t+1}, {g + 8, 2t}, {g, 2t + 8}, {g + 8, 2t + 8}; B {k 2t..2t+1, n g},
// {k 2t + 8.., n g}; C/D {row g, n 2t, 2t + 1}, {row g + 8, n 2t, 2t + 1}; the lower k of a
// pair in the lower 16 bits.
inline void EmulatedMma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                             uint32_t b0, uint32_t b1) {
  using k3::simt::Bf16Half;
  const int lane = threadIdx.x % 32, base = threadIdx.x - lane;
  k3::simt::mma_slots[threadIdx.x] = k3::simt::MmaFragments{{a0, a1, a2, a3}, {b0, b1}};
  k3::simt::WarpBarrier();
  auto a = [&](int row, int k) {
    const auto& f = k3::simt::mma_slots[base + (row % 8) * 4 + (k % 8) / 2];
    return Bf16Half(f.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto b = [&](int k, int n) {
    const auto& f = k3::simt::mma_slots[base + n * 4 + (k % 8) / 2];
    return Bf16Half(f.b[k >= 8 ? 1 : 0], k % 2);
  };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i & 1);
    float sum = c[i];
    for (int k = 0; k < 16; ++k) sum += a(row, k) * b(k, col);
    d[i] = sum;
  }
  k3::simt::WarpBarrier();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

#endif  // K3SERVE_KERNELS_CUDA_SIMT_EMULATION_H_
