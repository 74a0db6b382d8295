// The MXFP4 expert kernels (kernels/cuda/moe_mxfp4.h) at K3's expert shape (d 3584, f 3072),
// 16 experts per call (one MoE layer's top-16), 1 / 4 / 16 / 64 / 512 rows per expert, against
// the device's limits measured in the same run:
//  - copy: a device-to-device cudaMemcpy of 2 GiB, bytes read plus written per second (the
//    attainable HBM rate; docs/GPU.md and shared/notes/gpu.md: about 4.3 TB/s on an H200);
//  - the kernels: packed weight bytes (codes and scales of the 16 experts' three matrices, counted
//    once per call) per second, as a fraction of the copy rate, and bf16-equivalent TFLOP/s
//    (2 * 3 * d * f per row and expert) as a fraction of kBf16PeakTflops.
// Rounds interleave the shapes; each round times 10 calls with CUDA events; the table gives the
// median call and the range over rounds. Standalone (cudart only), so it runs on a bare GPU
// machine. Exit status 1 on any CUDA error.
//
//   bazel-bin/bench/moe_mxfp4_bench [rounds]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/gpu_timing.h"
#include "kernels/cuda/moe_mxfp4.h"

namespace k3 {
namespace {

constexpr int kWidth = 3584, kHidden = 3072, kExperts = 16;
// bf16 dense matrix rate measured on this workplace's H200 (cuBLAS 8192^3, shared/notes/gpu.md).
constexpr double kBf16PeakTflops = 780.0;

// Pseudo-random bytes (splitmix64 of the index): codes of every value; scales kept near the
// value that gives unit-scale sums, so the epilogue sees realistic magnitudes.
__global__ void FillRandom(uint8_t* p, size_t n, uint64_t seed, int scale_base) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = scale_base > 0 ? static_cast<uint8_t>(scale_base + z % 3) : static_cast<uint8_t>(z);
  }
}

void Fill(void* p, size_t n, uint64_t seed, int scale_base) {
  FillRandom<<<1024, 256>>>(static_cast<uint8_t*>(p), n, seed, scale_base);
  CHECK_CUDA(cudaGetLastError());
}

struct Shape {
  int rows_per_expert;
  MoeMxfp4Launch launch;
  std::vector<double> seconds;
};

constexpr size_t kCodeBytes = size_t{kWidth} * kHidden / 2, kScaleBytes = kCodeBytes / 16;
constexpr size_t kExpertBytes = 3 * (kCodeBytes + kScaleBytes);

// kExperts experts of random codes, scales near 2^-7 (sums of about unit size for d- and f-wide
// inputs alike), in device memory; returns the device table of their matrices.
const Mxfp4DeviceExpert* RandomDeviceExperts() {
  uint8_t* weights;
  CHECK_CUDA(cudaMalloc(&weights, kExpertBytes * kExperts));
  std::vector<Mxfp4DeviceExpert> table(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    const uint8_t* m[6];
    for (int i = 0; i < 3; ++i) {
      uint8_t* codes = weights + e * kExpertBytes + i * (kCodeBytes + kScaleBytes);
      Fill(codes, kCodeBytes, 100 + 3 * e + i, 0);
      Fill(codes + kCodeBytes, kScaleBytes, 200 + 3 * e + i, 119);
      m[2 * i] = codes;
      m[2 * i + 1] = codes + kCodeBytes;
    }
    table[e] = Mxfp4DeviceExpert{{m[0], m[1]}, {m[2], m[3]}, {m[4], m[5]}};
  }
  Mxfp4DeviceExpert* device_table;
  CHECK_CUDA(cudaMalloc(&device_table, sizeof(Mxfp4DeviceExpert) * kExperts));
  CHECK_CUDA(cudaMemcpy(device_table, table.data(), sizeof(Mxfp4DeviceExpert) * kExperts,
                        cudaMemcpyHostToDevice));
  return device_table;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device;
  CHECK_CUDA(cudaMalloc(&device, sizeof(T) * host.size()));
  CHECK_CUDA(cudaMemcpy(device, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice));
  return device;
}

// A decode step of `per_expert` rows, each choosing all kExperts experts (top-16).
Shape MakeShape(int per_expert, const Mxfp4DeviceExpert* experts) {
  const int slots = per_expert * kExperts;
  const int chunk_tokens = per_expert <= 8 ? 8 : per_expert <= 16 ? 16 : 32;
  std::vector<MoeChunk> chunks;
  // Row i's slots: i, per_expert + i, ... (one per expert).
  std::vector<int32_t> row_slots(slots);
  for (int e = 0; e < kExperts; ++e) {
    for (int first = 0; first < per_expert; first += chunk_tokens) {
      chunks.push_back(
          MoeChunk{e, e * per_expert + first, std::min(chunk_tokens, per_expert - first)});
    }
    for (int i = 0; i < per_expert; ++i) row_slots[i * kExperts + e] = e * per_expert + i;
  }
  // bf16 activations: random mantissas and signs, exponents near 1 (high bytes 0x3f/0xbf).
  std::vector<uint16_t> x(static_cast<size_t>(slots) * kWidth);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<uint16_t>(0x3f00 + (i * 2654435761u >> 7) % 0x100) | ((i * 40503u) & 0x8000);
  }
  Shape s{per_expert, {}, {}};
  MoeMxfp4Launch& l = s.launch;
  l.experts = experts;
  l.chunks = ToDevice(chunks);
  l.chunk_count = static_cast<int32_t>(chunks.size());
  l.chunk_tokens = chunk_tokens;
  l.width = kWidth;
  l.hidden = kHidden;
  l.x = ToDevice(x);
  l.h = ToDevice(std::vector<uint16_t>(static_cast<size_t>(slots) * kHidden));
  l.slot_weight = ToDevice(std::vector<float>(slots, 1.0f / kExperts));
  l.slot_out = ToDevice(std::vector<float>(static_cast<size_t>(slots) * kWidth));
  l.row_slots = ToDevice(row_slots);
  l.rows = per_expert;
  l.per_row = kExperts;
  l.out = ToDevice(std::vector<float>(static_cast<size_t>(per_expert) * kWidth));
  l.glu = GpuGluParams{1, 4.0f, 25.0f};
  return s;
}

void PrintTable(const std::vector<Shape>& shapes, double copy_rate) {
  const double packed = double(kExpertBytes) * kExperts;
  printf("\nMXFP4 experts, d %d f %d, %d experts per call, %.0f MB packed\n", kWidth, kHidden,
         kExperts, packed / 1e6);
  printf("%-12s %10s %16s %10s %12s %10s\n", "rows/expert", "us/call", "us range", "GB/s",
         "x copy", "x bf16 peak");
  for (const Shape& s : shapes) {
    const double seconds = Median(s.seconds);
    const double lo = *std::min_element(s.seconds.begin(), s.seconds.end());
    const double hi = *std::max_element(s.seconds.begin(), s.seconds.end());
    const double flops = 2.0 * 3 * kWidth * kHidden * double(s.rows_per_expert) * kExperts;
    printf("%-12d %10.1f %7.1f-%-8.1f %10.0f %12.3f %10.3f\n", s.rows_per_expert, seconds * 1e6,
           lo * 1e6, hi * 1e6, packed / seconds / 1e9, packed / seconds / copy_rate,
           flops / seconds / 1e12 / kBf16PeakTflops);
  }
}

int Main(int rounds) {
  if (NoGpu()) return 0;
  PrintDevice();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const size_t copy_bytes = size_t{1} << 31;
  void *copy_from, *copy_to;
  CHECK_CUDA(cudaMalloc(&copy_from, copy_bytes));
  CHECK_CUDA(cudaMalloc(&copy_to, copy_bytes));
  Fill(copy_from, copy_bytes, 1, 0);
  const Mxfp4DeviceExpert* experts = RandomDeviceExperts();
  std::vector<Shape> shapes;
  for (int per_expert : {1, 4, 16, 64, 512}) shapes.push_back(MakeShape(per_expert, experts));

  auto call = [&](const Shape& s) {  // the combine overwrites out
    CHECK_CUDA(static_cast<cudaError_t>(LaunchMoeMxfp4(s.launch, stream)));
  };
  auto copy = [&] {
    CHECK_CUDA(cudaMemcpyAsync(copy_to, copy_from, copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  for (const Shape& s : shapes) TimeOnStream([&] { call(s); }, 3, stream);  // warm-up
  TimeOnStream(copy, 2, stream);
  std::vector<double> copy_seconds;
  for (int round = 0; round < rounds; ++round) {
    copy_seconds.push_back(TimeOnStream(copy, 5, stream));
    for (Shape& s : shapes) s.seconds.push_back(TimeOnStream([&] { call(s); }, 10, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());
  const double copy_rate = 2.0 * copy_bytes / Median(copy_seconds);
  printf("copy: %.0f GB/s (read + write, median of %d rounds)\n", copy_rate / 1e9, rounds);
  PrintTable(shapes, copy_rate);
  return 0;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) { return k3::Main(argc > 1 ? std::max(3, atoi(argv[1])) : 9); }
