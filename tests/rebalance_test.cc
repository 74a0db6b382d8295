// Expert rebalancing in a real multi-process cluster (coordinator, attention, two routers and three
// expert nodes of //:k3serve over UCX) serving a checkpoint whose gate rows of experts 0-2 (all
// on expert worker 0 at first) are scaled up, so those experts get most of the tokens:
//  - the coordinator's Rebalance, issued while streams are generating, rolls out a placement with
//    replicas of the hot experts in the workers' spare slots;
//  - the per-worker load spread (MaxVio over workers) shrinks, both as the coordinator computes it
//    from the routers' expert loads and as measured by the rows each expert node computed;
//  - every stream completes, the ones running across the switch included, with exactly the
//    tokens of a run without rebalancing (the single-process engine).
// The streams across the switch ask for far more tokens than they can make while Rebalance runs,
// so they are provably mid-flight at the switch (each has a token before it starts and is not done
// when it returns); the test aborts them once each has made more tokens after it.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/grpc_status.h"
#include "launcher/local_cluster.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "proto/cluster.grpc.pb.h"
#include "proto/generate.grpc.pb.h"
#include "tests/cluster_testing.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;
namespace v1 = k3serve::v1;

constexpr int kStreams = 4;
constexpr int kMaxNewTokens = 48;
// The streams across the switch: they would run for many seconds; the test aborts them once each
// has made kTokensAfterSwitch tokens after the switch.
constexpr int kAcrossMaxNewTokens = 4096;
constexpr int kTokensAfterSwitch = 8;
constexpr absl::Duration kStreamDeadline = absl::Seconds(60);
constexpr absl::Duration kRpcTimeout = absl::Seconds(30);

std::string SkewedCheckpoint() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/k3-tiny-skewed");
  RandomCheckpointOptions options;
  options.hot_experts = {0, 1, 2};
  options.hot_gate_scale = 4.0f;
  const absl::Status written =
      WriteRandomModelFolder(NamedConfig("k3-tiny").value(), 7, dir, options);
  EXPECT_TRUE(written.ok()) << written;
  return dir;
}

// One Generate stream read chunk by chunk, so the test can tell how far it got.
class Stream {
 public:
  Stream(const std::string& address, v1::GenerateRequest request)
      : thread_([this, address, request = std::move(request)] { Run(address, request); }) {}
  ~Stream() { Join(); }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  int tokens() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(received_.size());
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  // Waits until the stream has `count` tokens or is done; false at `deadline`.
  bool WaitForTokens(int count, absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto reached = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ || received_.size() >= static_cast<size_t>(count);
    };
    return mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  }
  // After Join.
  const absl::Status& status() const { return status_; }
  const std::vector<int32_t>& received() const { return received_; }
  const v1::Complete& complete() const { return complete_; }

 private:
  void Run(const std::string& address, const v1::GenerateRequest& request) {
    auto stub =
        v1::K3Serve::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kStreamDeadline));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      absl::MutexLock lock(&mu_);
      if (response.has_chunk()) {
        received_.insert(received_.end(), response.chunk().token_ids().begin(),
                         response.chunk().token_ids().end());
      } else if (response.has_complete()) {
        complete_ = response.complete();
      }
    }
    const absl::Status status = FromGrpcStatus(reader->Finish());
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_;            // written under mu_, read after Join
  std::vector<int32_t> received_;  // written under mu_, read after Join
  v1::Complete complete_;          // written under mu_, read after Join
  std::thread thread_;  // last: starts once the rest exists
};

double MaxVioOf(const std::vector<double>& loads) {
  double sum = 0, max = 0;
  for (double x : loads) {
    sum += x;
    max = std::max(max, x);
  }
  const double mean = sum / static_cast<double>(loads.size());
  return mean > 0 ? (max - mean) / mean : 0;
}

// What the expert nodes computed, in worker order of the placement.
struct Served {
  std::vector<double> rows;                      // [worker]
  std::vector<std::vector<double>> assignments;  // [worker][model layer]
};

class RebalanceTest : public testing::Test {
 protected:
  pb::LoadReport Report() {
    auto stub = pb::Coordinator::NewStub(
        grpc::CreateChannel(cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    pb::GetLoadReportRequest request;
    request.set_refresh(true);
    pb::LoadReport report;
    const grpc::Status status = stub->GetLoadReport(&context, request, &report);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return report;
  }

  // What each expert node computed since it started, in worker order of the placement, and the
  // placement version each serves.
  Served Counts(std::vector<int64_t>* versions = nullptr) {
    absl::StatusOr<pb::ClusterState> state = cluster_->GetClusterState(absl::Seconds(5));
    EXPECT_TRUE(state.ok()) << state.status();
    Served served;
    for (uint32_t node : state->placement().worker_node_ids()) {
      std::string address;
      for (const pb::Member& m : state->members()) {
        if (m.node().node_id() == node) address = m.node().grpc_address();
      }
      auto stub = pb::ExpertWorker::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
      pb::ExpertStatusResponse status;
      const grpc::Status rpc = stub->Status(&context, {}, &status);
      EXPECT_TRUE(rpc.ok()) << "expert node " << node << ": " << rpc.error_message();
      served.rows.push_back(static_cast<double>(status.rows_processed()));
      std::vector<double> per_layer(config_layers_, 0.0);
      for (int l = 0; l < status.assignments_per_layer_size() && l < config_layers_; ++l) {
        per_layer[l] = static_cast<double>(status.assignments_per_layer(l));
      }
      served.assignments.push_back(std::move(per_layer));
      if (versions != nullptr) versions->push_back(status.placement_version());
    }
    return served;
  }

  // Runs every prompt at once to completion and checks the tokens.
  void Wave(const std::string& name) {
    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < kStreams; ++i) {
      streams.push_back(std::make_unique<Stream>(
          address_, GreedyRequest(absl::StrCat(name, "-", i), prompts_[i], kMaxNewTokens)));
    }
    for (int i = 0; i < kStreams; ++i) {
      streams[i]->Join();
      ASSERT_TRUE(streams[i]->status().ok()) << name << " " << i << ": " << streams[i]->status();
      EXPECT_EQ(streams[i]->received(), expected_[i]) << name << " " << i;
    }
  }

  std::unique_ptr<LocalCluster> cluster_;
  int config_layers_ = 0;
  std::string address_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::vector<int32_t>> expected_;
};

std::string AcrossId(int i) { return absl::StrCat("across-", i); }

Served Minus(const Served& a, const Served& b) {
  Served d = a;
  for (size_t w = 0; w < a.rows.size(); ++w) {
    d.rows[w] -= b.rows[w];
    for (size_t l = 0; l < a.assignments[w].size(); ++l) d.assignments[w][l] -= b.assignments[w][l];
  }
  return d;
}

// MaxVio over workers of the (row, expert) pairs each computed, per layer, then the mean over the
// layers that had any: what placement balances, measured at the expert nodes.
double MeasuredMaxVio(const Served& served) {
  double sum = 0;
  int layers = 0;
  for (size_t l = 0; !served.assignments.empty() && l < served.assignments[0].size(); ++l) {
    std::vector<double> loads;
    double total = 0;
    for (const std::vector<double>& worker : served.assignments) {
      loads.push_back(worker[l]);
      total += worker[l];
    }
    if (total == 0) continue;
    sum += MaxVioOf(loads);
    ++layers;
  }
  return layers > 0 ? sum / layers : 0;
}

TEST_F(RebalanceTest, SpreadShrinksAndStreamsAcrossTheSwitchKeepTheirTokens) {
  const std::string model = SkewedCheckpoint();
  prompts_ = TestPrompts(kStreams, 512, 31);
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(model, prompts_, kMaxNewTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  expected_ = *std::move(expected);

  LocalClusterOptions options = TestClusterOptions(model, /*attention=*/1, /*routers=*/2,
                                                   /*experts=*/3);
  options.extra_args[NodeRole::kCoordinator] = {
      "--spare-slots-per-worker", "2", "--load-stats-interval-ms", "0", "--retire-delay-ms", "200"};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = *std::move(cluster);
  address_ = cluster_->generate_addresses()[0];

  // Before: the initial contiguous placement.
  config_layers_ = NamedConfig("k3-tiny")->num_hidden_layers;
  const Served start = Counts();
  ASSERT_NO_FATAL_FAILURE(Wave("before"));
  const Served served_before = Minus(Counts(), start);
  const pb::LoadReport before = Report();
  ASSERT_EQ(before.placement_version(), 1);
  ASSERT_EQ(before.routers(), 2);
  ASSERT_GT(before.layers(0).tokens(), 0u);

  // The switch, while streams generate: each has its first token and none can finish meanwhile.
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<Stream>(
        address_, GreedyRequest(AcrossId(i), prompts_[i], kAcrossMaxNewTokens)));
  }
  const absl::Time first_tokens_deadline = absl::Now() + kStreamDeadline;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(streams[i]->WaitForTokens(1, first_tokens_deadline)) << "stream " << i;
    ASSERT_FALSE(streams[i]->done()) << "stream " << i << ": " << streams[i]->tokens()
                                     << " tokens, then ended before the switch";
  }
  auto stub = pb::Coordinator::NewStub(
      grpc::CreateChannel(cluster_->coordinator_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
  pb::RebalanceResponse rebalanced;
  const grpc::Status status = stub->Rebalance(&context, pb::RebalanceRequest(), &rebalanced);
  std::vector<int> tokens_at_switch;
  for (const auto& stream : streams)
    tokens_at_switch.push_back(stream->done() ? -1 : stream->tokens());
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(rebalanced.rolled_out()) << rebalanced.reason();
  EXPECT_EQ(rebalanced.placement_version(), 2);
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_GE(tokens_at_switch[i], 1) << "stream " << i << " did not run across the switch";
  }
  // Tokens made after the switch, then the end: each stream is aborted, keeping what it made.
  const absl::Time after_switch_deadline = absl::Now() + kStreamDeadline;
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(streams[i]->WaitForTokens(tokens_at_switch[i] + kTokensAfterSwitch,
                                          after_switch_deadline))
        << "stream " << i;
    grpc::ClientContext abort_context;
    abort_context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
    v1::AbortRequest abort;
    abort.set_request_id(AcrossId(i));
    v1::AbortResponse aborted;
    const grpc::Status abort_status =
        v1::K3Serve::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()))
            ->Abort(&abort_context, abort, &aborted);
    EXPECT_TRUE(abort_status.ok()) << abort_status.error_message();
    EXPECT_TRUE(aborted.found()) << "stream " << i << " ended before its abort";
  }
  size_t longest = 0;
  for (int i = 0; i < kStreams; ++i) {
    streams[i]->Join();
    ASSERT_TRUE(streams[i]->status().ok()) << "stream " << i << ": " << streams[i]->status();
    EXPECT_EQ(streams[i]->complete().finish_reason(), v1::Complete::CANCELLED) << "stream " << i;
    EXPECT_GE(streams[i]->received().size(),
              static_cast<size_t>(tokens_at_switch[i] + kTokensAfterSwitch))
        << "stream " << i;
    longest = std::max(longest, streams[i]->received().size());
  }
  // Greedy tokens do not depend on where a stream stops: each must be the start of the
  // single-process engine's tokens.
  absl::StatusOr<std::vector<std::vector<int32_t>>> across =
      SingleProcessTokens(model, prompts_, static_cast<int>(longest));
  ASSERT_TRUE(across.ok()) << across.status();
  for (int i = 0; i < kStreams; ++i) {
    const std::vector<int32_t>& got = streams[i]->received();
    ASSERT_LE(got.size(), (*across)[i].size()) << "stream " << i;
    EXPECT_EQ(got, std::vector<int32_t>((*across)[i].begin(), (*across)[i].begin() + got.size()))
        << "stream " << i;
  }

  // After: the new placement only.
  const Served after_switch = Counts();
  ASSERT_NO_FATAL_FAILURE(Wave("after"));
  std::vector<int64_t> served;
  const Served served_after = Minus(Counts(&served), after_switch);
  const pb::LoadReport after = Report();
  EXPECT_EQ(after.placement_version(), 2);
  for (int64_t version : served) EXPECT_EQ(version, 2);

  std::string per_layer;
  for (int l = 0; l < before.layers_size(); ++l) {
    absl::StrAppendFormat(&per_layer, " layer %d: %.3f -> %.3f;", l,
                          before.layers(l).worker_max_vio(), after.layers(l).worker_max_vio());
  }
  const std::string summary = absl::StrFormat(
      "MaxVio over expert workers, mean over MoE layers (coordinator, from expert loads): "
      "before %.3f, after %.3f (planned %.3f -> %.3f on %d tokens).%s\n"
      "Measured at the expert nodes: (row, expert) pairs per worker and layer, MaxVio mean over "
      "layers: before %.3f, after %.3f; rows per worker: before [%s], after [%s]; streams had %s "
      "tokens when the routers switched",
      before.worker_max_vio(), after.worker_max_vio(), rebalanced.worker_max_vio_before(),
      rebalanced.worker_max_vio_after(), rebalanced.window_tokens(), per_layer,
      MeasuredMaxVio(served_before), MeasuredMaxVio(served_after),
      absl::StrJoin(served_before.rows, ","), absl::StrJoin(served_after.rows, ","),
      absl::StrJoin(tokens_at_switch, ","));
  std::cout << summary << std::endl;
  RecordProperty("summary", summary);
  EXPECT_LT(after.worker_max_vio(), 0.5 * before.worker_max_vio()) << summary;
  EXPECT_LT(MeasuredMaxVio(served_after), 0.5 * MeasuredMaxVio(served_before)) << summary;

  const absl::Status stopped = cluster_->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace k3
