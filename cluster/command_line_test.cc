#include "cluster/command_line.h"

#include <gtest/gtest.h>

namespace k3 {
namespace {

struct Options {
  NodeFlags node;
  int count = 3;
  absl::Duration timeout = absl::Seconds(5);
  std::vector<int32_t> tokens;
  ComputeDevice device;
};

void AddOptions(CLI::App* app, Options* o) {
  AddNodeFlags(app, &o->node);
  AddBoundedInt(app, "--count", &o->count, 1, 100, "count");
  AddMilliseconds(app, "--timeout-ms", &o->timeout, 1, 60000, "timeout");
  AddIntList(app, "--tokens", &o->tokens, 0, 1000, "tokens");
  AddDeviceFlag(app, &o->device, "device");
}

absl::StatusOr<Options> Parse(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--coordinator", "c:1", "--model", "/m"};
  all.insert(all.end(), args.begin(), args.end());
  return ParseFlags<Options>(AddOptions, all);
}

TEST(CommandLineTest, ParsesValuesAndKeepsDefaults) {
  absl::StatusOr<Options> o = Parse({"--count=7", "--tokens", "1,2,3", "--port", "9000"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->node.coordinator, "c:1");
  EXPECT_EQ(o->node.model, "/m");
  EXPECT_EQ(o->node.port, 9000);
  EXPECT_EQ(o->node.metrics_port, -1);
  EXPECT_EQ(o->node.host, "0.0.0.0");
  EXPECT_EQ(o->count, 7);
  EXPECT_EQ(o->timeout, absl::Seconds(5));
  EXPECT_EQ(o->tokens, (std::vector<int32_t>{1, 2, 3}));
  o = Parse({"--timeout-ms", "250"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->timeout, absl::Milliseconds(250));
  EXPECT_EQ(o->count, 3);
}

TEST(CommandLineTest, DeviceFlag) {
  absl::StatusOr<Options> o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, ComputeDevice{});
  o = Parse({"--device", "cuda:2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, ComputeDevice{2});
  o = Parse({"--device", "gpu"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("is not cpu, cuda or cuda:N"), std::string::npos)
      << o.status();
}

TEST(CommandLineTest, RejectsWhatWouldWrapOrPassSilently) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--count", "4294967297"},  // would wrap to 1 as a 32-bit int
           {"--count", "-5"},
           {"--count", "0"},
           {"--count", "99999999999999999999"},
           {"--count", "5x"},
           {"--count", ""},
           {"--port", "70000"},
           {"--timeout-ms", "0"},
           {"--tokens", "1,,2"},
           {"--tokens", "1,2,"},
           {"--tokens", "1001"},
           {"--tokens", "-1"},
           {"--tokens", "a"},
           {"--cuont", "3"},
           {"stray"},
       }) {
    absl::StatusOr<Options> o = Parse(args);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
  }
}

TEST(CommandLineTest, RequiredFlagsAndTypoSuggestion) {
  absl::StatusOr<Options> o = ParseFlags<Options>(AddOptions, {"--model", "/m"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("--coordinator"), absl::string_view::npos)
      << o.status().message();
  o = Parse({"--metrics-prot", "1"});
  EXPECT_NE(o.status().message().find("did you mean --metrics-port?"), absl::string_view::npos)
      << o.status().message();
}

TEST(CommandLineTest, HelpListsEveryFlag) {
  absl::StatusOr<Options> o = Parse({"--help"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* flag : {"--coordinator", "--model", "--port", "--count", "--timeout-ms"}) {
    EXPECT_NE(o.status().message().find(flag), absl::string_view::npos) << flag;
  }
}

// A tool's main runs only on a good parse; --help exits 0 and a bad flag 2 (not run either way).
TEST(CommandLineTest, ToolExitStatus) {
  int count = 3;
  auto parse = [&count](const std::vector<std::string>& args) {
    CLI::App app;
    AddBoundedInt(&app, "--count", &count, 1, 100, "count");
    return ParseToolArgs(&app, args);
  };
  EXPECT_EQ(parse({"--count", "7"}), std::nullopt);
  EXPECT_EQ(count, 7);
  EXPECT_EQ(parse({"--help"}), 0);
  EXPECT_EQ(parse({"--count", "0"}), 2);
  EXPECT_EQ(parse({"--cuont", "5"}), 2);
}

struct ClientOptions {
  std::string server;
  TlsFlags tls;
  std::string auth_token_file;
};

void AddClientOptions(CLI::App* app, ClientOptions* o) {
  CLI::Option* server = app->add_option("--server", o->server, "server");
  AddClientSecurityFlags(app, server, &o->tls, &o->auth_token_file);
}

TEST(CommandLineTest, ClientSecurityFlags) {
  absl::StatusOr<ClientOptions> o = ParseFlags<ClientOptions>(
      AddClientOptions, {"--server", "h:1", "--auth-token-file", "/t", "--tls-ca", "/ca"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->auth_token_file, "/t");
  EXPECT_EQ(o->tls.ca, "/ca");
  EXPECT_TRUE(o->tls.enabled());
  // The token goes to a server: without --server it is a mistake, not a silent no-op.
  o = ParseFlags<ClientOptions>(AddClientOptions, {"--auth-token-file", "/t"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("--server"), absl::string_view::npos) << o.status().message();
}

TEST(CommandLineTest, NearestName) {
  EXPECT_EQ(NearestName("--prot", {"--port", "--host"}), "--port");
  EXPECT_EQ(NearestName("--xyz", {"--port", "--host"}), "");
  EXPECT_EQ(NearestName("--port", {"--port"}), "");  // not a typo
}

}  // namespace
}  // namespace k3
