// ProcessEngine: on "cpu" its logits equal LocalEngine's (the same runner code, so equality is
// exact), and its generation (the GenerationScheduler) gives the tokens of the plain one-sequence
// loop (OracleGenerate), greedy and seeded, alone and with other requests batched beside it; a
// CUDA device where there is none (no toolkit in the build, or no GPU) is refused with
// Unavailable and a reason, never a crash.
#include "engine/process_engine.h"

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine/local_engine.h"
#include "engine/oracle_generation.h"
#include "gtest/gtest.h"
#include "model/random_checkpoint.h"

namespace k3 {
namespace {

std::string Checkpoint() {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok());
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base != nullptr ? base : "/tmp") + "/process_engine";
  EXPECT_TRUE(WriteRandomCheckpoint(*config, 3, dir).ok());
  return dir;
}

TEST(ProcessEngineTest, CpuLogitsAreTheLocalEngines) {
  const std::string dir = Checkpoint();
  auto engine = ProcessEngine::Open(dir, ComputeDevice{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto local = LocalEngine::Open(dir);
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> tokens = {1, 5, 9, 200};
  for (bool decode : {false, true}) {
    auto got = (*engine)->Logits(tokens, decode);
    auto want = (*local)->Logits(tokens, decode);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(*got, *want) << "decode " << decode;
  }
}

TEST(ProcessEngineTest, GenerationIsTheOneSequenceLoopsAloneAndBatched) {
  const std::string dir = Checkpoint();
  auto engine = ProcessEngine::Open(dir, ComputeDevice{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto local = LocalEngine::Open(dir);
  ASSERT_TRUE(local.ok());
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest request;
    for (int t = 0; t < 3 + 7 * i; ++t) request.prompt.push_back((37 * t + 11 * i + 1) % 500);
    request.max_new_tokens = 6 + i;
    request.ignore_eos = i % 2 == 0;
    if (i >= 3) {  // seeded sampling
      request.sampling.temperature = 0.8f;
      request.sampling.top_p = 0.9f;
      request.sampling.seed = 100 + i;
    }
    requests.push_back(request);
  }
  std::vector<std::vector<int32_t>> want;
  for (const GenerationRequest& request : requests) {
    absl::StatusOr<std::vector<int32_t>> tokens = OracleGenerate(**local, request);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    want.push_back(*tokens);
  }
  for (size_t i = 0; i < requests.size(); ++i) {  // one at a time
    absl::StatusOr<std::vector<int32_t>> got = (*engine)->Generate(requests[i]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want[i]) << "request " << i << " alone";
  }
  std::vector<absl::StatusOr<std::vector<int32_t>>> batched(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { batched[i] = (*engine)->Generate(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(batched[i].ok()) << batched[i].status();
    EXPECT_EQ(*batched[i], want[i]) << "request " << i << " batched";
  }
}

TEST(ProcessEngineTest, BadRequestsAreRefused) {
  auto engine = ProcessEngine::Open(Checkpoint(), ComputeDevice{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerationRequest request;
  EXPECT_EQ((*engine)->Generate(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.prompt = {1, 2, 1 << 30};
  EXPECT_EQ((*engine)->Generate(request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Logits({}, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProcessEngineTest, RefusesACudaDeviceThatIsNotThere) {
  // Device 1000 exists on no machine, with or without the toolkit.
  auto engine = ProcessEngine::Open(Checkpoint(), ComputeDevice{1000});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable) << engine.status();
}

}  // namespace
}  // namespace k3
