// Failures in a real multi-process cluster: a cancelled or aborted stream frees its request state,
// and an expert process killed with SIGKILL mid-generation ends the streams it serves (after the
// attention worker's MoE timeout, 1 s here, passes without the worker coming back) with
// UNAVAILABLE naming it, leaves no process hanging, is marked DEAD by the coordinator, and a
// restarted expert process takes its place so that new requests succeed again.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "launcher/local_cluster.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/generate.grpc.pb.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;
namespace v1 = k3serve::v1;

// Long enough that no stream can finish before the test interferes with it.
constexpr int kLongGeneration = 4000;
constexpr int kMaxNewTokens = 8;
const std::vector<int32_t> kPrompt = {5, 17, 200, 3, 99};

// A1/R1/E2 without replicas. A MoE layer waits for a lost expert worker to come back for 1 s here
// (--moe-timeout-ms; 30 s by default), so that the streams it cannot serve end soon.
LocalClusterOptions FaultClusterOptions(const std::string& model) {
  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 2);
  options.extra_args[NodeRole::kAttention] = {"--moe-timeout-ms", "1000"};
  return options;
}

class ClusterFaultTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 3));
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::Start(FaultClusterOptions(*model_));
    if (!cluster.ok()) {
      start_error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = cluster->release();
  }

  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      const absl::Status stopped = cluster_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped;
    }
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << *start_error_;
    stub_ = v1::K3Serve::NewStub(
        grpc::CreateChannel(cluster_->generate_addresses()[0], grpc::InsecureChannelCredentials()));
  }

  v1::ServerInfo ServerInfo() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::ServerInfo info;
    const grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return info;
  }

  // Waits up to 2 s until the attention node holds no request and no request state.
  void ExpectStateFreed() {
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    v1::ServerInfo info = ServerInfo();
    while ((info.active_requests() != 0 || info.cached_sequences() != 0 ||
            info.request_state_bytes() != 0) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      info = ServerInfo();
    }
    EXPECT_EQ(info.active_requests(), 0);
    EXPECT_EQ(info.cached_sequences(), 0);
    EXPECT_EQ(info.request_state_bytes(), 0);
  }

  // Waits up to 2 s until the running request shows up in the node's counters (they are
  // refreshed between model steps), then returns them.
  v1::ServerInfo ExpectStateHeld() {
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    v1::ServerInfo info = ServerInfo();
    while (info.request_state_bytes() == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      info = ServerInfo();
    }
    EXPECT_EQ(info.active_requests(), 1);
    EXPECT_EQ(info.cached_sequences(), 1);
    EXPECT_GT(info.request_state_bytes(), 0);
    return info;
  }

  struct Stream {
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  };

  // Starts a long greedy generation and returns once its first tokens arrived.
  Stream StartStream(const std::string& id) {
    Stream stream;
    stream.context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stream.reader =
        stub_->Generate(stream.context.get(), GreedyRequest(id, kPrompt, kLongGeneration));
    v1::GenerateResponse response;
    EXPECT_TRUE(stream.reader->Read(&response)) << id;
    EXPECT_TRUE(response.has_chunk()) << id << ": " << response.DebugString();
    return stream;
  }

  static std::string* model_;
  static std::string* start_error_;
  static LocalCluster* cluster_;
  std::unique_ptr<v1::K3Serve::Stub> stub_;
};

std::string* ClusterFaultTest::model_ = nullptr;
std::string* ClusterFaultTest::start_error_ = nullptr;
LocalCluster* ClusterFaultTest::cluster_ = nullptr;

TEST_F(ClusterFaultTest, CancelledStreamFreesItsState) {
  Stream stream = StartStream("cancelled");
  ExpectStateHeld();
  stream.context->TryCancel();
  v1::GenerateResponse response;
  while (stream.reader->Read(&response)) {
  }
  EXPECT_EQ(stream.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectStateFreed();
}

TEST_F(ClusterFaultTest, AbortedStreamCompletesCancelledAndFreesItsState) {
  Stream stream = StartStream("aborted");
  ExpectStateHeld();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::AbortRequest abort;
  abort.set_request_id("aborted");
  v1::AbortResponse aborted;
  ASSERT_TRUE(stub_->Abort(&context, abort, &aborted).ok());
  EXPECT_TRUE(aborted.found());
  v1::GenerateResponse response;
  v1::Complete complete;
  while (stream.reader->Read(&response)) {
    if (response.has_complete()) complete = response.complete();
  }
  EXPECT_TRUE(stream.reader->Finish().ok());
  EXPECT_EQ(complete.finish_reason(), v1::Complete::CANCELLED);
  ExpectStateFreed();
}

TEST_F(ClusterFaultTest, KilledExpertFailsItsStreamsFastAndARestartRecovers) {
  absl::StatusOr<const LocalCluster::Node*> victim = cluster_->node("expert-1");
  ASSERT_TRUE(victim.ok()) << victim.status();
  const pid_t pid = (*victim)->pid;
  absl::StatusOr<pb::ClusterState> before = cluster_->GetClusterState(absl::Seconds(2));
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<Stream> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(StartStream(absl::StrCat("doomed-", i)));
  ASSERT_TRUE(cluster_->Signal("expert-1", SIGKILL).ok());
  const absl::Time killed = absl::Now();
  for (size_t i = 0; i < streams.size(); ++i) {
    v1::GenerateResponse response;
    int tokens = 0;
    while (streams[i].reader->Read(&response)) {
      tokens += response.chunk().token_ids_size();
      // The stream may say why in a final Complete before its status; it must not claim success.
      if (response.has_complete()) {
        EXPECT_EQ(response.complete().finish_reason(), v1::Complete::ERROR) << "stream " << i;
      }
    }
    const grpc::Status status = streams[i].reader->Finish();
    EXPECT_LT(tokens, kLongGeneration) << "stream " << i << " finished before the kill mattered";
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << "stream " << i << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(absl::StrCat("pid ", pid)), std::string::npos)
        << "stream " << i << " does not name the killed worker: " << status.error_message();
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3)) << "the streams took too long to fail";
  ExpectStateFreed();
  absl::StatusOr<int> exit = cluster_->WaitExit("expert-1", absl::Seconds(2));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(*exit, 128 + SIGKILL);
  // Nobody else died or hangs: every other process runs, and the attention node answers.
  for (const LocalCluster::Node* node : cluster_->Reap()) ADD_FAILURE() << node->name << " exited";
  for (const LocalCluster::Node& node : cluster_->nodes()) {
    if (node.name != "expert-1") {
      EXPECT_GE(node.pid, 0) << node.name;
    }
  }

  // The coordinator declares it DEAD once its heartbeats stop.
  bool dead = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!dead && absl::Now() < deadline) {
    absl::StatusOr<pb::ClusterState> state = cluster_->GetClusterState(absl::Seconds(1));
    ASSERT_TRUE(state.ok()) << state.status();
    for (const pb::Member& m : state->members()) {
      dead |= m.node().pid() == pid && m.state() == pb::DEAD;
    }
    if (!dead) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(dead) << "the coordinator never marked the killed expert DEAD";

  // A new expert process takes over the dead one's experts; generation works again.
  ASSERT_TRUE(cluster_->Restart("expert-1").ok());
  const absl::Status ready = cluster_->WaitReady(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready;
  absl::StatusOr<pb::ClusterState> after = cluster_->GetClusterState(absl::Seconds(2));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(after->placement().version(), before->placement().version());
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(*model_, {kPrompt}, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<GenerateOutcome> outcome =
      GenerateOverGrpc(cluster_->generate_addresses()[0],
                       GreedyRequest("after-restart", kPrompt, kMaxNewTokens), absl::Seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, (*expected)[0]);
}

}  // namespace
}  // namespace k3
