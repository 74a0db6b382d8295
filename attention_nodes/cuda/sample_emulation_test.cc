// Token sampling's device code (sample_kernel.inc) run on the CPU under simt_emulation.h, one
// std::thread per CUDA thread, against attention_nodes/sampler.h's Sampler with the same seeds
// (sample_cases.h), so that the rank keys, the bitwise searches and the block reductions are
// checked on every machine, GPU or not. The picks must be equal (see sample_test.cc). A small
// vocabulary keeps the emulated threads' barriers few.
#include "kernels/cuda/simt_emulation.h"
// After the emulation, which defines what the device code uses of CUDA.
#include <cmath>
#include <cstdint>

#include "attention_nodes/cuda/sample.h"
#include "attention_nodes/cuda/sample_kernel.inc"

#include <vector>

#include "attention_nodes/cuda/sample_cases.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using sample_test::MakeSampleCase;
using sample_test::SampleCase;

std::vector<int32_t> RunEmulated(const SampleCase& c) {
  const int rows = static_cast<int>(c.params.size());
  std::vector<int32_t> tokens(rows, -2);
  simt::RunGrid({rows, 1, 1}, {kSampleThreads, 1, 1}, [&] {
    SampleKernel(c.logits.data(), c.stride, c.vocab, c.params.data(), tokens.data());
  });
  return tokens;
}

TEST(SampleEmulationTest, MatchesCpuSampler) {
  uint32_t seed = 1;
  for (const SamplingOptions& options : sample_test::SampleOptionsToCover()) {
    SCOPED_TRACE(testing::Message() << "temperature " << options.temperature << " top_k "
                                    << options.top_k << " top_p " << options.top_p);
    const SampleCase c = MakeSampleCase(options, 3, 300, seed, seed % 2 == 0, 2);
    ++seed;
    EXPECT_EQ(RunEmulated(c), c.expected);
  }
}

}  // namespace
}  // namespace k3
