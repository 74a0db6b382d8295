// An ExpertWorker computing on the GPU (UseDevice, `k3serve expert --device cuda:0`) answers as
// the same worker on the CPU, on a random k3-tiny checkpoint with MXFP4 experts (relative L2 per
// row within 1e-2: the bf16 rounding of rows and hidden vectors, expert_nodes/
// gpu_expert_compute_test.cc), keeps serving an old placement version during a rollout, and frees
// the device copy of weights no version uses any more. Without a GPU each case skips ("no GPU").
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "expert_nodes/device_experts.h"
#include "expert_nodes/expert_worker.h"
#include "expert_nodes/gpu_expert_compute.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/random_checkpoint.h"
#include "moe/expert_placement.h"

namespace k3 {

bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

namespace {

constexpr int kModelLayer = 3;  // MoE layer 2 of k3-tiny

struct Fixture {
  std::shared_ptr<const Checkpoint> checkpoint;
  std::unique_ptr<ClusterPlacement> placement;
};

Fixture Open(int version) {
  Fixture f;
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/gpu_worker_ckpt";
  RandomCheckpointOptions options;
  options.mxfp4 = true;
  EXPECT_TRUE(WriteRandomCheckpoint(*config, 5, dir, options).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  f.checkpoint = *std::move(checkpoint);
  absl::StatusOr<ExpertPlacement> experts =
      ContiguousPlacement(config->NumMoeLayers(), config->num_experts, {config->num_experts},
                          version);
  EXPECT_TRUE(experts.ok()) << experts.status();
  f.placement = std::make_unique<ClusterPlacement>(ClusterPlacement{*experts, {1}});
  return f;
}

std::shared_ptr<const ModelWeights> Load(const Fixture& f, const ExpertHosting& hosting) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadWeights(f.checkpoint, WeightSelection::Experts(hosting.Union()));
  EXPECT_TRUE(weights.ok()) << weights.status();
  return weights.ok() ? std::shared_ptr<const ModelWeights>(*std::move(weights)) : nullptr;
}

ExpertRequest RandomRequest(const ModelConfig& config, int64_t rows, uint64_t seed,
                            int64_t version) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> value(0.f, 1.f);
  std::uniform_int_distribution<int> expert(0, config.num_experts - 1);
  ExpertRequest request;
  request.step_id = seed;
  request.layer = kModelLayer;
  request.placement_version = version;
  request.rows_count = rows;
  request.width = config.ExpertWidth();
  request.rows.resize(rows * request.width);
  for (float& v : request.rows) v = value(rng);
  for (int32_t r = 0; r < rows; ++r) {
    for (int k = 0; k < config.num_experts_per_token; ++k) {
      request.assignments.push_back({r, expert(rng), 0.1f + 0.2f * k});
    }
  }
  return request;
}

ExpertResponse ServeDecoded(ExpertWorker& worker, const ExpertRequest& request) {
  ExpertResponse response;
  absl::Status served;
  EXPECT_TRUE(Decode(worker.Serve(request, request.rows, &served), &response).ok());
  return response;
}

void ExpectRowsMatch(const ExpertResponse& gpu, const ExpertResponse& cpu) {
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(gpu.rows.size(), cpu.rows.size());
  for (int64_t r = 0; r < cpu.rows_count; ++r) {
    double diff = 0, norm = 0;
    for (int64_t c = 0; c < cpu.width; ++c) {
      const double want = cpu.rows[r * cpu.width + c], got = gpu.rows[r * cpu.width + c];
      diff += (got - want) * (got - want);
      norm += want * want;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-2) << "row " << r;
  }
}

TEST(GpuExpertWorkerTest, AnswersAsTheCpuWorkerThroughARollout) {
  REQUIRE_GPU();
  const Fixture f = Open(3);
  const ModelConfig& config = f.checkpoint->config();
  const ExpertHosting hosting = HostingFor(*f.placement, 1);
  std::shared_ptr<const ModelWeights> weights = Load(f, hosting);
  ExpertWorker cpu(weights, hosting, "cpu worker");
  ExpertWorker gpu(weights, hosting, "gpu worker");
  absl::StatusOr<std::unique_ptr<DeviceExperts>> device = MakeDeviceExperts(ComputeDevice{0});
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_TRUE(gpu.UseDevice(*std::move(device)).ok());
  const int64_t one_copy = gpu.device_weight_bytes();
  EXPECT_GT(one_copy, 0);

  for (int64_t rows : {1, 7, 40}) {
    const ExpertRequest request = RandomRequest(config, rows, 10 + rows, 3);
    ExpectRowsMatch(ServeDecoded(gpu, request), ServeDecoded(cpu, request));
  }

  // A rollout to version 4 with its own weights: both versions serve, on two device copies.
  ExpertHosting next = hosting;
  next.placement_version = 4;
  std::shared_ptr<const ModelWeights> next_weights = Load(f, next);
  gpu.AddVersion(next_weights, next);
  cpu.AddVersion(next_weights, next);
  ASSERT_TRUE(gpu.DeviceStatus(4).ok()) << gpu.DeviceStatus(4);
  EXPECT_EQ(gpu.device_weight_bytes(), 2 * one_copy);
  for (int64_t version : {3, 4}) {
    const ExpertRequest request = RandomRequest(config, 5, 20 + version, version);
    ExpectRowsMatch(ServeDecoded(gpu, request), ServeDecoded(cpu, request));
  }
  gpu.DropVersions([](int64_t v) { return v >= 4; });
  EXPECT_EQ(gpu.versions(), std::vector<int64_t>{4});
  EXPECT_EQ(gpu.device_weight_bytes(), one_copy);
}

TEST(GpuExpertWorkerTest, Bf16ExpertsAreRefusedWithTheReason) {
  REQUIRE_GPU();
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/gpu_worker_bf16";
  ASSERT_TRUE(WriteRandomCheckpoint(*config, 5, dir).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok());
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadWeights(std::shared_ptr<const Checkpoint>(*std::move(checkpoint)),
                  WeightSelection::Experts({0, 1}));
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpertHosting hosting;
  hosting.placement_version = 1;
  hosting.worker = 0;
  hosting.experts.assign(config->NumMoeLayers(), {0, 1});
  ExpertWorker gpu(std::shared_ptr<const ModelWeights>(*std::move(weights)), hosting, "gpu");
  absl::StatusOr<std::unique_ptr<DeviceExperts>> device = MakeDeviceExperts(ComputeDevice{0});
  ASSERT_TRUE(device.ok()) << device.status();
  const absl::Status refused = gpu.UseDevice(*std::move(device));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("MXFP4 weights only"), std::string::npos) << refused;
  EXPECT_EQ(gpu.DeviceStatus(1), refused);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  absl::StatusOr<int> devices = k3::CudaDeviceCount();
  k3::have_gpu = devices.ok();
  if (!k3::have_gpu) printf("skipped: no GPU (%s)\n", devices.status().ToString().c_str());
  return RUN_ALL_TESTS();
}
