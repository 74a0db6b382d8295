// Flag parsing of the expert node process.
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "expert_nodes/expert_node.h"

namespace k3 {
namespace {

// What the binary parses (tools/k3serve_main.cc declares the same flags).
absl::StatusOr<ExpertNodeOptions> Parse(const std::vector<std::string>& args) {
  return ParseFlags<ExpertNodeOptions>(AddExpertNodeFlags, args);
}

TEST(NodeArgsTest, ExpertNodeFlags) {
  absl::StatusOr<ExpertNodeOptions> options = Parse(
      {"--coordinator", "c:1", "--model=/m", "--slots", "12", "--port", "7000", "--metrics-port",
       "0", "--host", "127.0.0.1"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->node.coordinator, "c:1");
  EXPECT_EQ(options->node.model, "/m");
  EXPECT_EQ(options->slots, 12);
  EXPECT_EQ(options->node.port, 7000);
  EXPECT_EQ(options->node.metrics_port, 0);
  EXPECT_EQ(options->node.host, "127.0.0.1");

  absl::StatusOr<ExpertNodeOptions> defaults =
      Parse({"--coordinator", "c:1", "--model", "/m", "--slots", "1"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->node.port, 0);
  EXPECT_EQ(defaults->node.metrics_port, -1);
  EXPECT_EQ(defaults->node.host, "0.0.0.0");
  EXPECT_EQ(defaults->device, ComputeDevice{});

  absl::StatusOr<ExpertNodeOptions> gpu = Parse(
      {"--coordinator", "c:1", "--model", "/m", "--slots", "1", "--device", "cuda:2"});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->device, ComputeDevice{2});

  struct Bad {
    std::vector<std::string> args;
    const char* names;
  };
  const Bad bad[] = {
      {{"--model", "/m", "--slots", "1"}, "--coordinator"},
      {{"--coordinator", "c:1", "--slots", "1"}, "--model"},
      {{"--coordinator", "c:1", "--model", "/m"}, "--slots"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "0"}, "--slots"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "x"}, "--slots"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "2", "--port", "70000"}, "--port"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "2", "--metrics-port", "-5"},
       "--metrics-port"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "2", "--step-timeout-ms", "5"},
       "--step-timeout-ms"},
      {{"--coordinator", "c:1", "--model", "/m", "--slots", "2", "--device", "gpu"}, "--device"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<ExpertNodeOptions> parsed = Parse(b.args);
    ASSERT_FALSE(parsed.ok()) << b.names;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(b.names), absl::string_view::npos)
        << parsed.status();
  }
}

}  // namespace
}  // namespace k3
