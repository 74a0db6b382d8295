#include "cluster/node_transport.h"

#include "cluster/command_line.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// The parsed flags reach the transport's options.
TEST(NodeTransportTest, OptionsFollowTheFlags) {
  struct Options {
    NodeFlags node;
  };
  absl::StatusOr<Options> parsed = ParseFlags<Options>(
      [](CLI::App* app, Options* o) { AddNodeFlags(app, &o->node); },
      {"--coordinator", "c:1", "--model", "/m", "--busy-poll-us", "7", "--ucx-eager-limit",
       "256k"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const UcxTransportOptions options = NodeTransportOptions(parsed->node);
  EXPECT_EQ(options.busy_poll, absl::Microseconds(7));
  EXPECT_EQ(options.eager_limit, "256k");
  const UcxTransportOptions defaults = NodeTransportOptions(NodeFlags());
  EXPECT_EQ(defaults.busy_poll, absl::Microseconds(100));
  EXPECT_EQ(defaults.eager_limit, "1m");
}

}  // namespace
}  // namespace k3
