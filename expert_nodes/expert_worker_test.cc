#include "expert_nodes/expert_worker.h"

#include <cstdlib>
#include <memory>
#include <random>

#include "moe/expert_placement.h"
#include "cluster/inproc_transport.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/random_checkpoint.h"

namespace k3 {
namespace {

constexpr uint32_t kNodeA = 4;
constexpr uint32_t kNodeB = 9;
constexpr int kModelLayer = 3;  // MoE layer 2 of k3-tiny

class ExpertWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/expert_worker_ckpt";
    ASSERT_TRUE(WriteRandomCheckpoint(*config, 5, dir).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = new std::shared_ptr<const Checkpoint>(*std::move(checkpoint));
    // Worker 0 hosts 12 experts per layer, worker 1 the other 20.
    absl::StatusOr<ExpertPlacement> experts =
        ContiguousPlacement(config->NumMoeLayers(), config->num_experts, {12, 20}, 3);
    ASSERT_TRUE(experts.ok()) << experts.status();
    placement_ = new ClusterPlacement{*experts, {kNodeA, kNodeB}};
  }
  static void TearDownTestSuite() {
    delete checkpoint_;
    delete placement_;
  }

  static const ModelConfig& config() { return (*checkpoint_)->config(); }

  static std::shared_ptr<const ModelWeights> Load(const WeightSelection& selection) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(*checkpoint_, selection);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? std::shared_ptr<const ModelWeights>(*std::move(weights)) : nullptr;
  }

  static ExpertWorker MakeWorker(uint32_t node) {
    ExpertHosting hosting = HostingFor(*placement_, node);
    return ExpertWorker(Load(WeightSelection::Experts(hosting.Union())), hosting,
                        "expert node " + std::to_string(node));
  }

  // Random latent rows and assignments over every expert.
  static ExpertRequest RandomRequest(int64_t rows, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> value(0.f, 1.f);
    std::uniform_int_distribution<int> expert(0, config().num_experts - 1);
    ExpertRequest request;
    request.step_id = seed;
    request.layer = kModelLayer;
    request.placement_version = 3;
    request.rows_count = rows;
    request.width = config().ExpertWidth();
    request.rows.resize(rows * request.width);
    for (float& v : request.rows) v = value(rng);
    for (int32_t r = 0; r < rows; ++r) {
      for (int k = 0; k < 3; ++k) request.assignments.push_back({r, expert(rng), 0.25f + 0.1f * k});
    }
    return request;
  }

  static std::shared_ptr<const Checkpoint>* checkpoint_;
  static ClusterPlacement* placement_;
};

std::shared_ptr<const Checkpoint>* ExpertWorkerTest::checkpoint_ = nullptr;
ClusterPlacement* ExpertWorkerTest::placement_ = nullptr;

// Serves `request` with its own rows and decodes the answer the worker encoded.
ExpertResponse ServeDecoded(ExpertWorker& worker, const ExpertRequest& request) {
  ExpertResponse response;
  absl::Status served;
  absl::Status decoded = Decode(worker.Serve(request, request.rows, &served), &response);
  EXPECT_TRUE(decoded.ok()) << decoded;
  EXPECT_EQ(served, response.status);
  return response;
}

TEST_F(ExpertWorkerTest, HostingFollowsThePlacement) {
  ExpertHosting a = HostingFor(*placement_, kNodeA);
  EXPECT_EQ(a.worker, 0);
  EXPECT_EQ(a.placement_version, 3);
  ASSERT_EQ(static_cast<int>(a.experts.size()), config().NumMoeLayers());
  std::vector<int> first12(12);
  for (int e = 0; e < 12; ++e) first12[e] = e;
  for (const std::vector<int>& layer : a.experts) EXPECT_EQ(layer, first12);
  EXPECT_EQ(a.Union(), first12);
  EXPECT_EQ(a.TotalExperts(), 12 * config().NumMoeLayers());
  ExpertHosting spare = HostingFor(*placement_, 77);
  EXPECT_EQ(spare.worker, -1);
  EXPECT_TRUE(spare.experts.empty());
}

// A node maps only its slice: its expert bytes are its share of all experts' bytes.
TEST_F(ExpertWorkerTest, SelectedBytesScaleWithTheSlice) {
  std::shared_ptr<const ModelWeights> all = Load(WeightSelection::Experts(
      HostingFor(*placement_, kNodeA).Union()));
  std::vector<int> every(config().num_experts);
  for (int e = 0; e < config().num_experts; ++e) every[e] = e;
  std::shared_ptr<const ModelWeights> full = Load(WeightSelection::Experts(every));
  ASSERT_NE(all, nullptr);
  ASSERT_NE(full, nullptr);
  EXPECT_GT(all->selected_bytes, 0u);
  EXPECT_EQ(all->selected_bytes * config().num_experts, full->selected_bytes * 12);
}

// Two workers' partial sums add up to every expert computed in one place.
TEST_F(ExpertWorkerTest, PartialSumsOfTheSlicesAddUpToAllExperts) {
  ExpertWorker a = MakeWorker(kNodeA);
  ExpertWorker b = MakeWorker(kNodeB);
  const ExpertRequest request = RandomRequest(10, 42);
  ExpertRequest for_a = request;
  ExpertRequest for_b = request;
  for_a.assignments.clear();
  for_b.assignments.clear();
  for (const ExpertAssignment& x : request.assignments) {
    (x.expert < 12 ? for_a : for_b).assignments.push_back(x);
  }
  ExpertResponse answer_a = ServeDecoded(a, for_a);
  ExpertResponse answer_b = ServeDecoded(b, for_b);
  ASSERT_TRUE(answer_a.status.ok()) << answer_a.status;
  ASSERT_TRUE(answer_b.status.ok()) << answer_b.status;
  EXPECT_EQ(answer_a.step_id, request.step_id);
  EXPECT_EQ(answer_a.rows_count, request.rows_count);
  EXPECT_EQ(answer_a.width, request.width);
  EXPECT_EQ(a.rows_processed(), request.rows_count);
  ASSERT_EQ(a.assignments_per_layer().size(), static_cast<size_t>(request.layer + 1));
  EXPECT_EQ(a.assignments_per_layer()[request.layer], static_cast<int64_t>(for_a.assignments.size()));
  EXPECT_EQ(b.assignments_per_layer()[request.layer], static_cast<int64_t>(for_b.assignments.size()));

  std::vector<int> every(config().num_experts);
  for (int e = 0; e < config().num_experts; ++e) every[e] = e;
  std::shared_ptr<const ModelWeights> full = Load(WeightSelection::Experts(every));
  ASSERT_NE(full, nullptr);
  std::vector<float> expected(request.rows.size());
  ExpertScratch scratch;
  ASSERT_TRUE(RunExperts(full->layers[kModelLayer].moe.experts, GluParamsFor(config()),
                         request.rows.data(), request.rows_count, request.width,
                         request.assignments, expected.data(), &scratch)
                  .ok());
  double max_abs = 0;
  for (float v : expected) max_abs = std::max(max_abs, static_cast<double>(std::abs(v)));
  ASSERT_GT(max_abs, 1e-3);  // the experts did something
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(answer_a.rows[i] + answer_b.rows[i], expected[i], 1e-5 * (1 + max_abs)) << i;
  }
}

TEST_F(ExpertWorkerTest, BadRequestsFailWithTheirReason) {
  ExpertWorker a = MakeWorker(kNodeA);
  ExpertRequest request = RandomRequest(2, 7);
  request.assignments = {{0, 3, 1.f}, {1, 11, 0.5f}};
  ASSERT_TRUE(ServeDecoded(a, request).status.ok());

  ExpertRequest dense = request;
  dense.layer = 0;  // first_k_dense_replace = 1: no routed experts
  EXPECT_EQ(ServeDecoded(a, dense).status.code(), absl::StatusCode::kInvalidArgument);
  ExpertRequest beyond = request;
  beyond.layer = config().num_hidden_layers;
  EXPECT_EQ(ServeDecoded(a, beyond).status.code(), absl::StatusCode::kInvalidArgument);
  ExpertRequest wide = request;
  wide.width = config().hidden_size;
  wide.rows.resize(wide.rows_count * wide.width);
  EXPECT_EQ(ServeDecoded(a, wide).status.code(), absl::StatusCode::kInvalidArgument);

  ExpertRequest foreign = request;
  foreign.assignments = {{0, 12, 1.f}};
  ExpertResponse refused = ServeDecoded(a, foreign);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status.message().find("expert 12 of MoE layer 2 (model layer 3) is not hosted by "
                                          "expert node 4"),
            absl::string_view::npos)
      << refused.status;
  EXPECT_TRUE(refused.rows.empty());

  ExpertRequest bad_row = request;
  bad_row.assignments = {{2, 3, 1.f}};
  EXPECT_EQ(ServeDecoded(a, bad_row).status.code(), absl::StatusCode::kInvalidArgument);

  ExpertWorker spare(nullptr, HostingFor(*placement_, 77), "expert node 77");
  EXPECT_EQ(ServeDecoded(spare, request).status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.rows_processed(), 2);
}

TEST_F(ExpertWorkerTest, HandleAnswersOverTheTransportAndDefersNewerPlacements) {
  InProcNetwork network;
  auto router = network.CreateTransport();
  auto expert = network.CreateTransport();
  ASSERT_TRUE(router->Connect(kNodeA, expert->LocalAddress()).ok());
  ASSERT_TRUE(expert->Connect(2, router->LocalAddress()).ok());
  ExpertWorker a = MakeWorker(kNodeA);
  auto exchange = [&](const std::string& bytes, bool may_defer, ExpertResponse* response) {
    EXPECT_TRUE(router->Send(kNodeA, bytes).ok());
    absl::StatusOr<Received> received = expert->Receive(absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->from, 2u);
    ExpertWorker::Outcome outcome = a.Handle(expert.get(), *received, may_defer);
    if (outcome.deferred) return outcome;
    absl::StatusOr<Received> answer = router->Receive(absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(answer.ok()) << answer.status();
    EXPECT_TRUE(Decode(answer->bytes, response).ok());
    return outcome;
  };

  ExpertRequest request = RandomRequest(3, 8);
  request.assignments = {{0, 1, 1.f}, {2, 5, 0.5f}};
  ExpertResponse response;
  ExpertWorker::Outcome outcome = exchange(Encode(request), true, &response);
  EXPECT_FALSE(outcome.deferred);
  EXPECT_TRUE(outcome.answer.ok());
  EXPECT_TRUE(response.status.ok());
  EXPECT_EQ(response.step_id, request.step_id);
  EXPECT_EQ(response.rows, ServeDecoded(a, request).rows);

  std::string truncated = Encode(request);
  truncated.resize(truncated.size() - 5);
  outcome = exchange(truncated, true, &response);
  EXPECT_EQ(outcome.answer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.step_id, request.step_id);

  // A router on a newer placement asks for an expert this worker's placement does not give it.
  ExpertRequest newer = request;
  newer.placement_version = 4;
  newer.assignments = {{0, 20, 1.f}};
  outcome = exchange(Encode(newer), /*may_defer=*/true, &response);
  EXPECT_TRUE(outcome.deferred);
  outcome = exchange(Encode(newer), /*may_defer=*/false, &response);
  EXPECT_FALSE(outcome.deferred);
  EXPECT_EQ(response.status.code(), absl::StatusCode::kFailedPrecondition);
  // What it hosts is served whatever the version.
  newer.assignments = {{0, 2, 1.f}};
  outcome = exchange(Encode(newer), /*may_defer=*/true, &response);
  EXPECT_FALSE(outcome.deferred);
  EXPECT_TRUE(response.status.ok()) << response.status;
}

// During a rollout a node holds two placement versions: each request is served with the experts
// of the version it was planned with, and what only the old version hosted goes with it.
TEST_F(ExpertWorkerTest, ServesEachRequestWithTheExpertsOfItsPlacementVersion) {
  ExpertWorker a = MakeWorker(kNodeA);  // version 3: experts 0-11
  ExpertHosting next = HostingFor(*placement_, kNodeA);
  next.placement_version = 5;
  for (std::vector<int>& layer : next.experts) layer = {10, 11, 12, 13};
  a.AddVersion(Load(WeightSelection::Experts(next.Union())), next);
  EXPECT_EQ(a.versions(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a.hosting().placement_version, 5);
  ASSERT_NE(a.FindVersion(3), nullptr);
  EXPECT_EQ(a.FindVersion(3)->experts[0].size(), 12u);
  EXPECT_EQ(a.FindVersion(4), nullptr);
  EXPECT_NE(a.WeightsWith({0, 11}), nullptr);
  EXPECT_EQ(a.WeightsWith({0, 12}), nullptr);
  EXPECT_EQ(a.WeightsWith({12, 13}), a.weights());

  ExpertRequest old_request = RandomRequest(4, 21);
  old_request.assignments = {{0, 2, 1.f}, {1, 11, 0.5f}, {3, 7, 0.25f}};
  ExpertRequest new_request = old_request;
  new_request.placement_version = 5;
  new_request.assignments = {{0, 12, 1.f}, {2, 11, 0.5f}};
  const ExpertResponse served_old = ServeDecoded(a, old_request);
  ASSERT_TRUE(served_old.status.ok()) << served_old.status;
  const ExpertResponse served_new = ServeDecoded(a, new_request);
  ASSERT_TRUE(served_new.status.ok()) << served_new.status;
  // Between the two, version 4 (never held) is served as 3, the newest below it.
  ExpertRequest between = old_request;
  between.placement_version = 4;
  EXPECT_TRUE(ServeDecoded(a, between).status.ok());
  ExpertRequest newer = new_request;
  newer.placement_version = 6;
  EXPECT_TRUE(ServeDecoded(a, newer).status.ok());  // the newest held, 5, hosts expert 12

  // The same sums as one worker holding every expert.
  std::vector<int> every(config().num_experts);
  for (int e = 0; e < config().num_experts; ++e) every[e] = e;
  std::shared_ptr<const ModelWeights> full = Load(WeightSelection::Experts(every));
  for (const auto& [request, answer] :
       {std::make_pair(&old_request, &served_old), std::make_pair(&new_request, &served_new)}) {
    std::vector<float> expected(request->rows.size());
    ExpertScratch scratch;
    ASSERT_TRUE(RunExperts(full->layers[kModelLayer].moe.experts, GluParamsFor(config()),
                           request->rows.data(), request->rows_count, request->width,
                           request->assignments, expected.data(), &scratch)
                    .ok());
    EXPECT_EQ(answer->rows, expected);
  }

  // Version 3 retires: its requests for experts 0-9 now fail, naming both versions.
  a.DropVersions([](int64_t v) { return v >= 5; });
  EXPECT_EQ(a.versions(), std::vector<int64_t>{5});
  const ExpertResponse refused = ServeDecoded(a, old_request);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status.message().find("placement version 5; the router used version 3"),
            absl::string_view::npos)
      << refused.status;
  // The newest version always stays.
  a.DropVersions([](int64_t) { return false; });
  EXPECT_EQ(a.versions(), std::vector<int64_t>{5});
  EXPECT_EQ(a.rows_processed(), 4 * 4);
}

}  // namespace
}  // namespace k3
