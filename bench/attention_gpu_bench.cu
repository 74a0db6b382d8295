// The attention kernels of attention_nodes/cuda at K3's widths, against the device's copy rate
// measured in the same run (issue 21's goal: KDA and MLA decode at >= 0.7 of it):
//  - copy: a device-to-device cudaMemcpy of 2 GiB, bytes read plus written per second (about
//    4.3 TB/s on an H200, shared/notes/gpu.md);
//  - KDA decode (one K3 KDA layer: 96 heads of 128, conv kernel 4) at batch 1, 8, 32: the bytes a
//    step must move (fp32 state and conv caches read and written, the token's inputs and output)
//    per second, as a fraction of the copy rate;
//  - MLA decode (one K3 MLA layer: 96 heads, bf16 cache rows of 512 + 64) at contexts 2k, 8k, 32k
//    and batch 1 and 8 (the fp32 kernel on the CUDA cores): cache bytes read per second as a
//    fraction of the copy rate, and the FLOP rate (2 x 96 x (576 + 512) per key).
// Each call uses a different set of states or caches, cycling over at least 256 MB, so that the
// 50 MB L2 cache does not serve a call from the previous one's bytes. Rounds interleave the cases;
// each round times 10 calls with CUDA events; the table gives the median call and the range over
// rounds. Standalone (cudart only), so it runs on a bare GPU machine. Exit status 1 on any CUDA
// error.
//
//   bazel-bin/bench/attention_gpu_bench [rounds]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "attention_nodes/cuda/kda_decode.h"
#include "attention_nodes/cuda/mla_decode.h"
#include "bench/gpu_timing.h"

namespace k3 {
namespace {

constexpr int kHeads = 96, kHeadDim = 128, kConvKernel = 4;
constexpr int kLatent = 512, kRope = 64, kPageSize = 64;
constexpr double kCycleBytes = 256e6;  // > 5x the H200's L2

__device__ float HashUniform(uint64_t seed, size_t i) {  // splitmix64 -> [-1, 1)
  uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

__global__ void FillFloats(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = lo + (hi - lo) * 0.5f * (HashUniform(seed, i) + 1.0f);
  }
}

__global__ void FillBf16(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<uint16_t>(__float_as_uint(HashUniform(seed, i)) >> 16);
  }
}

// Device memory freed at exit.
std::vector<void*> allocations;

template <typename T>
T* Alloc(size_t n) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  allocations.push_back(p);
  return static_cast<T*>(p);
}

uint64_t next_seed = 1;

float* RandomFloats(size_t n, float lo, float hi) {
  float* p = Alloc<float>(n);
  FillFloats<<<1024, 256>>>(p, n, next_seed++, lo, hi);
  CHECK_CUDA(cudaGetLastError());
  return p;
}

int Sets(double bytes_per_call) {
  return std::max(2, static_cast<int>((kCycleBytes + bytes_per_call - 1) / bytes_per_call));
}

struct Case {
  std::string kind;  // "kda" or "mla"
  int batch = 0;
  int context = 0;     // MLA only
  double bytes = 0;    // moved per call
  double flops = 0;    // MLA only
  std::function<void()> run;
  std::vector<double> seconds;
};

// One K3 KDA layer's decode step for `batch` sequences.
Case KdaCase(int batch, cudaStream_t stream) {
  const int64_t width = int64_t{kHeads} * kHeadDim, window = kConvKernel - 1;
  const double slot_bytes = 4.0 * (kHeads * kHeadDim * kHeadDim + 3 * window * width);
  const int sets = Sets(batch * slot_bytes);
  const int64_t slots = int64_t{sets} * batch;
  std::vector<int32_t> slot_ids(slots);
  for (int64_t i = 0; i < slots; ++i) slot_ids[i] = static_cast<int32_t>(i);
  int32_t* slot_dev = Alloc<int32_t>(slots);
  CHECK_CUDA(
      cudaMemcpy(slot_dev, slot_ids.data(), sizeof(int32_t) * slots, cudaMemcpyHostToDevice));

  KdaDecodeLaunch l;
  l.batch = batch;
  l.heads = kHeads;
  l.head_dim = kHeadDim;
  l.conv_kernel = kConvKernel;
  l.state = RandomFloats(slots * kHeads * kHeadDim * kHeadDim, -0.1f, 0.1f);
  l.conv_cache = RandomFloats(slots * 3 * window * width, -1.0f, 1.0f);
  l.q = RandomFloats(batch * width, -1.0f, 1.0f);
  l.k = RandomFloats(batch * width, -1.0f, 1.0f);
  l.v = RandomFloats(batch * width, -1.0f, 1.0f);
  l.q_conv = RandomFloats(width * kConvKernel, -0.5f, 0.5f);
  l.k_conv = RandomFloats(width * kConvKernel, -0.5f, 0.5f);
  l.v_conv = RandomFloats(width * kConvKernel, -0.5f, 0.5f);
  l.decay = RandomFloats(batch * width, -1.0f, 1.0f);
  l.dt_bias = RandomFloats(width, -0.5f, 0.5f);
  l.a_log = RandomFloats(kHeads, 0.0f, 2.7f);
  l.beta_logit = RandomFloats(batch * kHeads, -2.0f, 2.0f);
  l.gate = RandomFloats(batch * width, -1.0f, 1.0f);
  l.o_norm = RandomFloats(kHeadDim, 0.9f, 1.1f);
  l.out = Alloc<float>(batch * width);

  Case c;
  c.kind = "kda";
  c.batch = batch;
  // State and conv caches read and written; q, k, v, f, gate read and the output written.
  c.bytes = batch * (2 * slot_bytes + 4.0 * 6 * width + 4.0 * kHeads);
  c.run = [l, slot_dev, sets, batch, stream, call = 0]() mutable {
    KdaDecodeLaunch launch = l;
    launch.slots = slot_dev + (call++ % sets) * batch;
    CHECK_CUDA(static_cast<cudaError_t>(LaunchKdaDecode(launch, stream)));
  };
  return c;
}

// One K3 MLA layer's absorbed decode for `batch` sequences of `context` cached tokens.
Case MlaCase(int batch, int context, cudaStream_t stream) {
  constexpr int kWidth = kLatent + kRope;
  const int pages_per_sequence = (context + kPageSize - 1) / kPageSize;
  const double cache_bytes = 2.0 * kWidth * context * batch;
  const int sets = Sets(cache_bytes);
  const int64_t pages = int64_t{sets} * batch * pages_per_sequence;
  std::vector<int32_t> table(pages);
  for (int64_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>(i);
  int32_t* table_dev = Alloc<int32_t>(pages);
  CHECK_CUDA(cudaMemcpy(table_dev, table.data(), sizeof(int32_t) * pages, cudaMemcpyHostToDevice));
  std::vector<int32_t> lengths(batch, context);
  int32_t* lengths_dev = Alloc<int32_t>(batch);
  CHECK_CUDA(
      cudaMemcpy(lengths_dev, lengths.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
  uint16_t* cache = Alloc<uint16_t>(pages * kPageSize * kWidth);
  FillBf16<<<1024, 256>>>(cache, pages * kPageSize * kWidth, next_seed++);
  CHECK_CUDA(cudaGetLastError());

  MlaDecodeLaunch l;
  l.batch = batch;
  l.heads = kHeads;
  l.kv_lora_rank = kLatent;
  l.rope_dim = kRope;
  l.page_size = kPageSize;
  l.max_pages = pages_per_sequence;
  l.max_length = context;
  l.keys_per_split = MlaKeysPerSplit(batch, kHeads, context);
  l.lengths = lengths_dev;
  l.cache = cache;
  l.q = RandomFloats(int64_t{batch} * kHeads * kWidth, -0.1f, 0.1f);
  l.workspace = Alloc<float>(MlaDecodeWorkspaceFloats(l));
  l.out = Alloc<float>(int64_t{batch} * kHeads * kLatent);

  Case c;
  c.kind = "mla";
  c.batch = batch;
  c.context = context;
  c.bytes = cache_bytes + 4.0 * batch * kHeads * (kWidth + kLatent);
  c.flops = 2.0 * kHeads * (kWidth + kLatent) * context * batch;
  c.run = [l, table_dev, sets, batch, pages_per_sequence, stream, call = 0]() mutable {
    MlaDecodeLaunch launch = l;
    launch.block_table = table_dev + int64_t{call++ % sets} * batch * pages_per_sequence;
    CHECK_CUDA(static_cast<cudaError_t>(LaunchMlaDecode(launch, stream)));
  };
  return c;
}

void PrintCase(const Case& c, double copy_rate) {
  const double seconds = Median(c.seconds);
  const double lo = *std::min_element(c.seconds.begin(), c.seconds.end());
  const double hi = *std::max_element(c.seconds.begin(), c.seconds.end());
  printf("%-6s %6d %8d %10.1f %8.1f-%-9.1f %8.0f %8.3f", c.kind.c_str(), c.batch, c.context,
         seconds * 1e6, lo * 1e6, hi * 1e6, c.bytes / seconds / 1e9, c.bytes / seconds / copy_rate);
  if (c.flops > 0) printf(" %8.1f", c.flops / seconds / 1e12);
  printf("\n");
}

int Main(int rounds) {
  if (NoGpu()) return 0;
  PrintDevice();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const size_t copy_bytes = size_t{1} << 31;
  float* copy_from = RandomFloats(copy_bytes / 4, -1.0f, 1.0f);
  float* copy_to = Alloc<float>(copy_bytes / 4);
  auto copy = [&] {
    CHECK_CUDA(cudaMemcpyAsync(copy_to, copy_from, copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };

  std::vector<Case> cases;
  for (int batch : {1, 8, 32}) cases.push_back(KdaCase(batch, stream));
  for (int batch : {1, 8}) {
    for (int context : {2048, 8192, 32768}) cases.push_back(MlaCase(batch, context, stream));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  for (const Case& c : cases) TimeOnStream(c.run, 3, stream);  // warm-up
  TimeOnStream(copy, 2, stream);
  std::vector<double> copy_seconds;
  for (int round = 0; round < rounds; ++round) {
    copy_seconds.push_back(TimeOnStream(copy, 5, stream));
    for (Case& c : cases) c.seconds.push_back(TimeOnStream(c.run, 10, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());

  const double copy_rate = 2.0 * copy_bytes / Median(copy_seconds);
  printf("copy: %.0f GB/s (read + write, median of %d rounds)\n", copy_rate / 1e9, rounds);
  printf("\nKDA decode: one K3 layer (96 heads x 128, conv 4, fp32 state); MLA decode: one K3\n"
         "layer (96 heads, bf16 cache 512 + 64, absorbed); GB/s of the bytes a call must move\n");
  printf("%-6s %6s %8s %10s %18s %8s %8s %8s\n", "kind", "batch", "context", "us/call",
         "us range", "GB/s", "x copy", "TFLOP/s");
  for (const Case& c : cases) PrintCase(c, copy_rate);
  for (void* p : allocations) CHECK_CUDA(cudaFree(p));
  return 0;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) { return k3::Main(argc > 1 ? std::max(3, atoi(argv[1])) : 7); }
