// Flag parsing of the router process.
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "router/router_node.h"

namespace k3 {
namespace {

// What the binary parses (tools/k3serve_main.cc declares the same flags).
absl::StatusOr<RouterNodeOptions> Parse(const std::vector<std::string>& args) {
  return ParseFlags<RouterNodeOptions>(AddRouterNodeFlags, args);
}

TEST(NodeArgsTest, RouterNodeFlags) {
  absl::StatusOr<RouterNodeOptions> options = Parse(
      {"--coordinator", "c:1", "--model", "/m", "--step-timeout-ms", "250", "--qb-bins", "0",
       "--metrics-port", "9100"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->step_timeout, absl::Milliseconds(250));
  EXPECT_EQ(options->qb_bins, 0);
  EXPECT_EQ(options->node.metrics_port, 9100);
  EXPECT_EQ(options->node.port, 0);

  absl::StatusOr<RouterNodeOptions> defaults =
      Parse({"--coordinator", "c:1", "--model", "/m"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->step_timeout, absl::Seconds(5));
  EXPECT_EQ(defaults->qb_bins, 100);

  const std::vector<std::vector<std::string>> bad = {
      {"--model", "/m"},
      {"--coordinator", "c:1", "--model", "/m", "--step-timeout-ms", "0"},
      {"--coordinator", "c:1", "--model", "/m", "--qb-bins", "-1"},
      {"--coordinator", "c:1", "--model", "/m", "--slots", "3"},
      {"--coordinator", "c:1", "--model", "/m", "stray"},
  };
  for (const std::vector<std::string>& args : bad) {
    absl::StatusOr<RouterNodeOptions> parsed = Parse(args);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << args.back();
  }
}

}  // namespace
}  // namespace k3
