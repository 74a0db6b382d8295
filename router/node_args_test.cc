// Flag parsing of the router and expert node processes.
#include "expert_nodes/expert_node.h"
#include "gtest/gtest.h"
#include "router/router_node.h"

namespace k3 {
namespace {

TEST(NodeArgsTest, ExpertNodeFlags) {
  absl::StatusOr<ExpertNodeOptions> options = ParseExpertNodeArgs(
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
      ParseExpertNodeArgs({"--coordinator", "c:1", "--model", "/m", "--slots", "1"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->node.port, 0);
  EXPECT_EQ(defaults->node.metrics_port, -1);
  EXPECT_EQ(defaults->node.host, "0.0.0.0");

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
  };
  for (const Bad& b : bad) {
    absl::StatusOr<ExpertNodeOptions> parsed = ParseExpertNodeArgs(b.args);
    ASSERT_FALSE(parsed.ok()) << b.names;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(b.names), absl::string_view::npos)
        << parsed.status();
  }
}

TEST(NodeArgsTest, RouterNodeFlags) {
  absl::StatusOr<RouterNodeOptions> options = ParseRouterNodeArgs(
      {"--coordinator", "c:1", "--model", "/m", "--step-timeout-ms", "250", "--qb-bins", "0",
       "--metrics-port", "9100"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->step_timeout, absl::Milliseconds(250));
  EXPECT_EQ(options->qb_bins, 0);
  EXPECT_EQ(options->node.metrics_port, 9100);
  EXPECT_EQ(options->node.port, 0);

  absl::StatusOr<RouterNodeOptions> defaults =
      ParseRouterNodeArgs({"--coordinator", "c:1", "--model", "/m"});
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
    absl::StatusOr<RouterNodeOptions> parsed = ParseRouterNodeArgs(args);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << args.back();
  }
}

}  // namespace
}  // namespace k3
