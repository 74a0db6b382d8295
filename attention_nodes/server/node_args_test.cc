// Flag parsing of the attention node process.
#include "attention_nodes/server/attention_server.h"
#include "cluster/command_line.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// What `k3serve attention` parses: the node's flags (ParseFlags' INVALID_ARGUMENT naming the flag).
absl::StatusOr<AttentionServerOptions> ParseAttentionArgs(const std::vector<std::string>& args) {
  return ParseFlags<AttentionServerOptions>(AddAttentionFlags, args);
}

TEST(NodeArgsTest, PingPongFlag) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--model", "/m"};
  absl::StatusOr<AttentionServerOptions> defaults = ParseAttentionArgs(base);
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->scheduler.ping_pong, PingPong::kMeasured);
  const std::pair<const char*, PingPong> values[] = {
      {"auto", PingPong::kMeasured}, {"on", PingPong::kAlways}, {"OFF", PingPong::kOff}};
  for (const auto& [value, mode] : values) {
    std::vector<std::string> args = base;
    args.push_back(std::string("--ping-pong=") + value);
    absl::StatusOr<AttentionServerOptions> options = ParseAttentionArgs(args);
    ASSERT_TRUE(options.ok()) << value << ": " << options.status();
    EXPECT_EQ(options->scheduler.ping_pong, mode) << value;
  }
  std::vector<std::string> bad = base;
  bad.push_back("--ping-pong=sometimes");
  EXPECT_EQ(ParseAttentionArgs(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
