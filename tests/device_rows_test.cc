// The GPU tiers' direct path (issue 21) on the CPU: a RemoteDeviceExperts (the GPU attention
// worker's side) and two ExpertWorkers (the GPU expert nodes' side) exchange a MoE layer's rows
// and partial sums over device channels, with the control messages on a Transport. "Device
// memory" is host memory here (InProcDeviceChannels, a host DeviceExperts, host row ops), so the
// test checks the protocol, the plan and the sums, not the GPU kernels (those have their own GPU
// tests). The expected answer is RunExperts over the whole model's experts with every pair of the
// routing, computed in one call without any placement.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "attention_nodes/moe_client/remote_device_experts.h"
#include "cluster/device_channels.h"
#include "cluster/inproc_device_channel.h"
#include "cluster/inproc_transport.h"
#include "cluster/test_wait.h"
#include "expert_nodes/expert_compute.h"
#include "expert_nodes/expert_worker.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/glu_params.h"
#include "model/random_checkpoint.h"
#include "moe/expert_placement.h"
#include "proto/cluster.pb.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr uint32_t kAttention = 1;
constexpr uint32_t kNodeA = 4;  // worker 0: experts 0-11 of every layer
constexpr uint32_t kNodeB = 9;  // worker 1: experts 12-31
constexpr int kModelLayer = 3;  // MoE layer 2 of k3-tiny
constexpr int kTopK = 4;

// DeviceExperts whose device memory is host memory: RunExperts on the CPU.
class HostDeviceExperts : public DeviceExperts {
 public:
  absl::Status Add(const ModelWeights&) override { return absl::OkStatus(); }
  void Forget(const ModelWeights&) override {}
  absl::Status Run(const ModelWeights& weights, int layer, const float* z, int64_t rows,
                   int64_t width, const std::vector<ExpertAssignment>& assignments,
                   float* out) override {
    return RunExperts(weights.layers[layer].moe.experts, GluParamsFor(weights.config), z, rows,
                      width, assignments, out, &scratch_);
  }
  absl::Status RunDeviceRows(const ModelWeights& weights, int layer, const float* z, int64_t rows,
                             int64_t width, const std::vector<ExpertAssignment>& assignments,
                             float* out) override {
    return Run(weights, layer, z, rows, width, assignments, out);
  }
  absl::StatusOr<RowBuffers> ReserveRowBuffers(int64_t floats) override {
    rows_.resize(floats);
    answer_.resize(floats);
    return RowBuffers{rows_.data(), answer_.data()};
  }
  int64_t weight_bytes() const override { return 0; }

 private:
  ExpertScratch scratch_;
  std::vector<float> rows_, answer_;
};

class HostRowOps : public DeviceRowOps {
 public:
  absl::Status CopyToHost(const void* device, void* host, size_t bytes, void*) override {
    std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(void*) override { return absl::OkStatus(); }
  absl::Status Zero(float* out, int64_t n, void*) override {
    std::fill(out, out + n, 0.f);
    return absl::OkStatus();
  }
  absl::Status Add(const float* x, float* out, int64_t n, void*) override {
    for (int64_t i = 0; i < n; ++i) out[i] += x[i];
    return absl::OkStatus();
  }
  absl::StatusOr<float*> Scratch(int index, int64_t floats) override {
    if (scratch_.size() <= static_cast<size_t>(index)) scratch_.resize(index + 1);
    scratch_[index].resize(floats);
    return scratch_[index].data();
  }

 private:
  std::vector<std::vector<float>> scratch_;
};

// One expert node: its transport, channels and worker, served by a thread.
struct ExpertSide {
  uint32_t node = 0;
  std::unique_ptr<InProcTransport> transport;
  std::unique_ptr<DeviceChannels> channels;
  std::unique_ptr<ExpertWorker> worker;
  std::thread thread;
  std::atomic<bool> stop{false};

  void Serve() {
    while (!stop.load()) {
      absl::StatusOr<Received> received = transport->Receive(absl::Now() + absl::Milliseconds(20));
      if (received.ok()) worker->Handle(transport.get(), *received, /*may_defer=*/false);
    }
  }
};

class DeviceRowsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/device_rows_ckpt";
    ASSERT_TRUE(WriteRandomCheckpoint(*config, 7, dir).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = new std::shared_ptr<const Checkpoint>(*std::move(checkpoint));
    absl::StatusOr<std::unique_ptr<ModelWeights>> all =
        LoadWeights(*checkpoint_, WeightSelection::All());
    ASSERT_TRUE(all.ok()) << all.status();
    all_weights_ = all->release();
  }
  static void TearDownTestSuite() {
    delete all_weights_;
    delete checkpoint_;
  }
  static const ModelConfig& config() { return (*checkpoint_)->config(); }

  void SetUp() override {
    absl::StatusOr<ExpertPlacement> experts =
        ContiguousPlacement(config().NumMoeLayers(), config().num_experts, {12, 20}, 3);
    ASSERT_TRUE(experts.ok()) << experts.status();
    placement_ = ClusterPlacement{*experts, {kNodeA, kNodeB}};
    attention_transport_ = network_.CreateTransport();
    attention_channels_ = std::make_unique<DeviceChannels>(pipes_.Opener());
    for (uint32_t node : {kNodeA, kNodeB}) {
      auto side = std::make_unique<ExpertSide>();
      side->node = node;
      side->transport = network_.CreateTransport();
      ASSERT_TRUE(side->transport->Connect(kAttention, attention_transport_->LocalAddress()).ok());
      ASSERT_TRUE(attention_transport_->Connect(node, side->transport->LocalAddress()).ok());
      ExpertHosting hosting = HostingFor(placement_, node);
      absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
          LoadWeights(*checkpoint_, WeightSelection::Experts(hosting.Union()));
      ASSERT_TRUE(weights.ok()) << weights.status();
      side->worker =
          std::make_unique<ExpertWorker>(std::shared_ptr<const ModelWeights>(*std::move(weights)),
                                         hosting, absl::StrCat("expert node ", node));
      ASSERT_TRUE(side->worker->UseDevice(std::make_unique<HostDeviceExperts>()).ok());
      side->channels = std::make_unique<DeviceChannels>(pipes_.Opener());
      side->worker->set_device_channels(side->channels.get());
      experts_.push_back(std::move(side));
    }
    for (auto& side : experts_) {
      side->thread = std::thread([s = side.get()] { s->Serve(); });
    }
  }

  void TearDown() override {
    for (auto& side : experts_) {
      side->stop = true;
      side->thread.join();
    }
  }

  // Issues a channel each way between the attention worker and every node in `nodes`, and waits
  // until every end is open; node `unaware` (if any) never sees the state.
  void IssueChannels(const std::vector<uint32_t>& nodes, uint32_t unaware = 0) {
    pb::ClusterState state;
    uint64_t id = 1;
    for (uint32_t node : nodes) {
      for (auto [sender, receiver] : {std::pair{kAttention, node}, std::pair{node, kAttention}}) {
        pb::DeviceChannel* channel = state.add_device_channels();
        channel->set_id(id++);
        channel->set_sender(sender);
        channel->set_receiver(receiver);
        channel->set_nccl_unique_id("unused");
      }
    }
    attention_channels_->Apply(state, kAttention);
    for (auto& side : experts_) {
      if (side->node != unaware) side->channels->Apply(state, side->node);
    }
    ASSERT_TRUE(WaitFor([&] { return attention_channels_->OpenIds().size() == 2 * nodes.size(); }));
    for (auto& side : experts_) {
      const bool issued =
          std::find(nodes.begin(), nodes.end(), side->node) != nodes.end() && side->node != unaware;
      ASSERT_TRUE(WaitFor([&] { return side->channels->OpenIds().size() == (issued ? 2u : 0u); }));
    }
  }

  struct Layer {
    int64_t rows = 0;
    std::vector<float> z;
    std::vector<int32_t> ids;
    std::vector<float> weights;
  };
  // Random rows; each row picks kTopK distinct experts among the first `experts`.
  Layer RandomLayer(int64_t rows, int experts, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> value(0.f, 1.f);
    Layer layer;
    layer.rows = rows;
    layer.z.resize(rows * config().ExpertWidth());
    for (float& v : layer.z) v = value(rng);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> pick(experts);
      for (int e = 0; e < experts; ++e) pick[e] = e;
      std::shuffle(pick.begin(), pick.end(), rng);
      for (int k = 0; k < kTopK; ++k) {
        layer.ids.push_back(pick[k]);
        layer.weights.push_back(0.1f + 0.2f * static_cast<float>(k));
      }
    }
    return layer;
  }

  // RunExperts with every expert of the model and every pair.
  std::vector<float> Expected(const Layer& layer) const {
    std::vector<ExpertAssignment> pairs;
    for (int64_t r = 0; r < layer.rows; ++r) {
      for (int k = 0; k < kTopK; ++k) {
        pairs.push_back(
            {static_cast<int32_t>(r), layer.ids[r * kTopK + k], layer.weights[r * kTopK + k]});
      }
    }
    std::vector<float> out(layer.z.size());
    ExpertScratch scratch;
    EXPECT_TRUE(RunExperts(all_weights_->layers[kModelLayer].moe.experts, GluParamsFor(config()),
                           layer.z.data(), layer.rows, config().ExpertWidth(), pairs, out.data(),
                           &scratch)
                    .ok());
    return out;
  }

  absl::Status Run(RemoteDeviceExperts& remote, const Layer& layer, std::vector<float>* out) {
    out->assign(layer.z.size(), -1.f);
    return remote.Run(ops_, kModelLayer, layer.z.data(), layer.rows, config().ExpertWidth(),
                      layer.ids.data(), layer.weights.data(), kTopK, out->data(), nullptr);
  }

  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    double error = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      error += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
      norm += want[i] * static_cast<double>(want[i]);
    }
    // The same products; only the order of the final sums over the two nodes differs.
    EXPECT_LT(std::sqrt(error / norm), 1e-6);
  }

  static std::shared_ptr<const Checkpoint>* checkpoint_;
  static ModelWeights* all_weights_;
  InProcNetwork network_;
  InProcDeviceChannels pipes_{absl::Seconds(5)};
  ClusterPlacement placement_;
  std::unique_ptr<InProcTransport> attention_transport_;
  std::unique_ptr<DeviceChannels> attention_channels_;
  std::vector<std::unique_ptr<ExpertSide>> experts_;
  HostRowOps ops_;
};

std::shared_ptr<const Checkpoint>* DeviceRowsTest::checkpoint_ = nullptr;
ModelWeights* DeviceRowsTest::all_weights_ = nullptr;

TEST_F(DeviceRowsTest, PartialSumsOfBothNodesAddUpToAllExperts) {
  IssueChannels({kNodeA, kNodeB});
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config());
  remote.SetPlacement(placement_);
  for (uint64_t seed : {1, 2, 3}) {  // several layers in a row keep the channels in step
    const Layer layer = RandomLayer(5, config().num_experts, seed);
    std::vector<float> out;
    ASSERT_TRUE(Run(remote, layer, &out).ok());
    ExpectClose(out, Expected(layer));
  }
  EXPECT_EQ(remote.layers_served(), 3);
  EXPECT_TRUE(attention_channels_->TakeBroken().empty());
}

TEST_F(DeviceRowsTest, ALayerWithoutChannelsToANodeFailsBeforeSending) {
  IssueChannels({kNodeA});
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config());
  remote.SetPlacement(placement_);
  const Layer both = RandomLayer(4, config().num_experts, 11);
  std::vector<float> out;
  absl::Status status = Run(remote, both, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("expert node 9"), std::string::npos) << status;
  EXPECT_EQ(remote.layers_failed(), 0);  // refused before sending: the path was not tried
  // Nothing was sent, so node 4's channels are still in step: a layer it serves alone works.
  const Layer only_a = RandomLayer(4, 12, 12);
  ASSERT_TRUE(Run(remote, only_a, &out).ok());
  ExpectClose(out, Expected(only_a));
}

TEST_F(DeviceRowsTest, WithoutChannelsTheLayerIsRefusedAtOnce) {
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config());
  remote.SetPlacement(placement_);
  const Layer layer = RandomLayer(2, config().num_experts, 5);
  std::vector<float> out;
  EXPECT_EQ(Run(remote, layer, &out).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote.layers_served() + remote.layers_failed(), 0);
}

TEST_F(DeviceRowsTest, AnErrorAnswerFailsTheLayerAndKeepsTheChannelsInStep) {
  IssueChannels({kNodeA, kNodeB});
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config());
  // A placement that gives node 4 experts it does not hold: node 4 takes the rows, then refuses.
  ClusterPlacement wrong = placement_;
  std::swap(wrong.worker_nodes[0], wrong.worker_nodes[1]);
  remote.SetPlacement(wrong);
  const Layer layer = RandomLayer(3, config().num_experts, 21);
  std::vector<float> out;
  absl::Status status = Run(remote, layer, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("is not hosted by"), std::string::npos) << status;
  EXPECT_EQ(remote.layers_failed(), 1);
  EXPECT_TRUE(attention_channels_->TakeBroken().empty());
  remote.SetPlacement(placement_);
  ASSERT_TRUE(Run(remote, layer, &out).ok());
  ExpectClose(out, Expected(layer));
}

TEST_F(DeviceRowsTest, ANodeWithoutItsChannelEndSaysSoAndTheChannelIsGivenUp) {
  // Node 9 has not seen the state that issued its channels yet.
  IssueChannels({kNodeA, kNodeB}, /*unaware=*/kNodeB);
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config());
  remote.SetPlacement(placement_);
  const Layer layer = RandomLayer(3, config().num_experts, 31);
  std::vector<float> out;
  absl::Status status = Run(remote, layer, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("no device channel from node 1"), std::string::npos) << status;
  // The rows to node 9 were never taken: the attention worker's channel to it is out of step.
  EXPECT_EQ(attention_channels_->TakeBroken(), std::vector<uint64_t>{3});
}

TEST_F(DeviceRowsTest, ADeadNodeFailsTheLayerWithoutWaitingForTheTimeout) {
  IssueChannels({kNodeA, kNodeB});
  RemoteDeviceExpertsOptions options;
  options.timeout = absl::Seconds(30);
  RemoteDeviceExperts remote(attention_transport_.get(), attention_channels_.get(), config(),
                             options);
  remote.SetPlacement(placement_);
  experts_[1]->stop = true;
  experts_[1]->thread.join();
  experts_[1]->transport->Kill();
  experts_[1]->thread = std::thread([] {});
  const Layer layer = RandomLayer(3, config().num_experts, 41);
  std::vector<float> out;
  const absl::Time start = absl::Now();
  absl::Status status = Run(remote, layer, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace k3
