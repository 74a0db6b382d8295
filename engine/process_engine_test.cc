// OpenProcessEngine: "cpu" gives the CPU engine, whose logits equal LocalEngine's (the same code
// behind the interface, so equality is exact); a CUDA device where there is none (no toolkit in
// the build, or no GPU) is refused with Unavailable and a reason, never a crash.
#include "engine/process_engine.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/local_engine.h"
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

TEST(ProcessEngineTest, CpuIsTheLocalEngine) {
  const std::string dir = Checkpoint();
  auto engine = OpenProcessEngine(dir, ComputeDevice{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto local = LocalEngine::Open(dir);
  ASSERT_TRUE(local.ok());
  const std::vector<int32_t> tokens = {1, 5, 9, 200};
  auto got = (*engine)->Logits(tokens, false);
  auto want = (*local)->Logits(tokens, false);
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ(*got, *want);
}

TEST(ProcessEngineTest, RefusesACudaDeviceThatIsNotThere) {
  // Device 1000 exists on no machine, with or without the toolkit.
  auto engine = OpenProcessEngine(Checkpoint(), ComputeDevice{1000});
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable) << engine.status();
}

}  // namespace
}  // namespace k3
