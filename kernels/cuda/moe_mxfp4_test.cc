// The expert kernels' in-register widening of E2M1 codes on the GPU (LaunchMxfp4DequantProbe):
// every code at every register and half of a word becomes its exact value (kernels/mxfp4.h), signed zero and
// the subnormal code 0.5 included. A failure here names the code and position; the whole
// computation is tested in expert_nodes/gpu_expert_compute_test.cc. Skipped without a GPU.
#include "kernels/cuda/moe_mxfp4.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/mxfp4.h"

namespace k3 {

bool have_gpu = false;

namespace {

TEST(Mxfp4DequantTest, EveryCodeAtEveryPositionIsExact) {
  if (!have_gpu) GTEST_SKIP() << "no GPU";
  // Word i holds code i in all eight places (mxfp4_gpu_layout.h).
  std::vector<uint32_t> words(16, 0);
  for (uint32_t code = 0; code < 16; ++code) {
    for (int p = 0; p < 4; ++p) {
      for (int half = 0; half < 2; ++half) words[code] |= Mxfp4CodeBits(p, half, code);
    }
  }
  uint32_t *device_words = nullptr, *device_out = nullptr;
  ASSERT_EQ(cudaMalloc(&device_words, sizeof(uint32_t) * words.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&device_out, sizeof(uint32_t) * 4 * words.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(device_out, 0xff, sizeof(uint32_t) * 4 * words.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device_words, words.data(), sizeof(uint32_t) * words.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(LaunchMxfp4DequantProbe(device_words, device_out, 16, nullptr), cudaSuccess);
  std::vector<uint32_t> out(4 * words.size());
  ASSERT_EQ(cudaMemcpy(out.data(), device_out, sizeof(uint32_t) * out.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(device_words);
  cudaFree(device_out);
  for (int code = 0; code < 16; ++code) {
    for (int p = 0; p < 4; ++p) {
      for (int half = 0; half < 2; ++half) {
        const float got = Bf16ToFloat((out[4 * code + p] >> (16 * half)) & 0xffff);
        EXPECT_EQ(got, kE2m1Values[code]) << "code " << code << " register " << p << " half "
                                          << half;
        EXPECT_EQ(std::signbit(got), std::signbit(kE2m1Values[code])) << "code " << code;
      }
    }
  }
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  k3::have_gpu = error == cudaSuccess && devices > 0;
  if (!k3::have_gpu) {
    printf("skipped: no GPU (%s)\n",
           error == cudaSuccess ? "no device" : cudaGetErrorString(error));
  }
  return RUN_ALL_TESTS();
}
