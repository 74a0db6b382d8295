// Two "hosts" on one machine: the coordinator and the attention node stay in the test's network
// namespace, the router and the expert nodes run in a network namespace of their own, joined to it
// by a veth pair; UCX may use TCP over the veth only. Greedy tokens must still equal the
// single-process engine's. Needs root and network namespaces that can be set up fully (some
// sandboxes and containers create one but refuse addresses in it); skipped, with the reason,
// otherwise.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "attention_nodes/server/generate_client.h"
#include "launcher/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

constexpr int kMaxNewTokens = 8;

// Runs a shell command; OK when it exits 0, else an error with its output.
absl::Status Shell(const std::string& command) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("popen failed: ", command));
  std::string output;
  char buffer[256];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  if (status == 0) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat("`", command, "` failed (wait status ", status,
                                         "): ", absl::StripTrailingAsciiWhitespace(output)));
}

class ClusterNetnsTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "needs root for ip netns (running as uid " << geteuid() << ")";
    // Names and a /30 subnet unique to this process, so parallel runs do not collide.
    const int id = getpid() % 16000;
    netns_ = absl::StrCat("k3t", id);
    host_if_ = absl::StrCat("k3h", id);
    ns_if_ = absl::StrCat("k3n", id);
    const int block = id * 4;  // 10.200.0.0/16 holds 16384 /30 blocks
    const std::string prefix = absl::StrCat("10.200.", block / 256, ".");
    host_ip_ = absl::StrCat(prefix, block % 256 + 1);
    ns_ip_ = absl::StrCat(prefix, block % 256 + 2);
    if (absl::Status s = Shell(absl::StrCat("ip netns add ", netns_)); !s.ok()) {
      GTEST_SKIP() << "`ip netns add` does not work here (no ip tool, or no CAP_SYS_ADMIN in this "
                      "sandbox): "
                   << s.message();
    }
    created_ = true;
    const std::vector<std::string> setup = {
        absl::StrCat("ip link add ", host_if_, " type veth peer name ", ns_if_),
        absl::StrCat("ip link set ", ns_if_, " netns ", netns_),
        absl::StrCat("ip addr add ", host_ip_, "/30 dev ", host_if_),
        absl::StrCat("ip link set ", host_if_, " up"),
        absl::StrCat("ip netns exec ", netns_, " ip addr add ", ns_ip_, "/30 dev ", ns_if_),
        absl::StrCat("ip netns exec ", netns_, " ip link set ", ns_if_, " up"),
        absl::StrCat("ip netns exec ", netns_, " ip link set lo up"),
    };
    for (const std::string& command : setup) {
      if (absl::Status s = Shell(command); !s.ok()) {
        GTEST_SKIP() << "network namespaces cannot be set up fully here: " << s.message();
      }
    }
  }

  void TearDown() override {
    if (!created_) return;
    const absl::Status deleted = Shell(absl::StrCat("ip netns del ", netns_));
    EXPECT_TRUE(deleted.ok()) << deleted;
    // Deleting the namespace deleted the veth pair if its end got there; else delete it here.
    Shell(absl::StrCat("ip link del ", host_if_)).IgnoreError();
  }

  // Bytes this namespace's end of the veth pair received so far.
  int64_t ReceivedBytes() const {
    std::ifstream file(absl::StrCat("/sys/class/net/", host_if_, "/statistics/rx_bytes"));
    int64_t bytes = -1;
    file >> bytes;
    return bytes;
  }

  std::string netns_, host_if_, ns_if_, host_ip_, ns_ip_;
  bool created_ = false;
};

TEST_F(ClusterNetnsTest, TiersInSeparateNetworkNamespacesGenerateTheSameTokens) {
  const std::string model = RandomCheckpointDir("k3-tiny", 7);
  const std::vector<std::vector<int32_t>> prompts = TestPrompts(3, 512, 31);
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, prompts, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();

  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 2);
  NodeSite here;
  here.host = host_ip_;
  here.env = {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", host_if_}};
  NodeSite there;
  there.host = ns_ip_;
  there.netns = netns_;
  there.env = {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", ns_if_}};
  options.sites = {{NodeRole::kCoordinator, here},
                   {NodeRole::kAttention, here},
                   {NodeRole::kRouter, there},
                   {NodeRole::kExpert, there}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const int64_t received_before = ReceivedBytes();
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
        (*cluster)->generate_addresses()[0],
        GreedyRequest(absl::StrCat("netns-", i), prompts[i], kMaxNewTokens), absl::Seconds(30));
    ASSERT_TRUE(outcome.ok()) << "prompt " << i << ": " << outcome.status();
    EXPECT_EQ(outcome->tokens, (*expected)[i]) << "prompt " << i;
  }
  // The MoE rows crossed the veth: every token's hidden state went to the router namespace and
  // back in each MoE layer (8 layers x 24 tokens x 256 floats and more).
  EXPECT_GT(ReceivedBytes() - received_before, 128 * 1024);
  const absl::Status stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace k3
