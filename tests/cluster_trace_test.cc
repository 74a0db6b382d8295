// Request tracing through a real cluster: a Generate call with a sampled W3C traceparent leaves
// spans in every tier's --trace-file that join into one tree under the client's span
// (attention "k3.generate" > "k3.step" > router "k3.router.layer" > expert "k3.experts"), with
// one router span per MoE layer of every step; a call without one leaves none.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/trace_context.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "model/config.h"
#include "nlohmann/json.hpp"
#include "proto/generate.grpc.pb.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

std::vector<nlohmann::json> ReadSpans(const std::string& path) {
  std::vector<nlohmann::json> spans;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) spans.push_back(nlohmann::json::parse(line));
  return spans;
}

// Runs Generate to the end, with `traceparent` as metadata unless empty; the tokens.
std::vector<int32_t> Generate(const std::string& address, const v1::GenerateRequest& request,
                              const std::string& traceparent) {
  auto stub = v1::K3Serve::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  if (!traceparent.empty()) context.AddMetadata(kTraceparentHeader, traceparent);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  std::vector<int32_t> tokens;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (!response.has_chunk()) continue;
    tokens.insert(tokens.end(), response.chunk().token_ids().begin(),
                  response.chunk().token_ids().end());
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  return tokens;
}

TEST(ClusterTraceTest, SpansOfEveryTierJoinUnderTheClientsSpan) {
  const std::string model = RandomCheckpointDir("k3-tiny", 3);
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::map<NodeRole, std::string> files = {
      {NodeRole::kAttention, dir + "/attention.jsonl"},
      {NodeRole::kRouter, dir + "/router.jsonl"},
      {NodeRole::kExpert, dir + "/expert.jsonl"}};
  LocalClusterOptions options = TestClusterOptions(model, 1, 1, 2);
  for (const auto& [role, path] : files) options.extra_args[role] = {"--trace-file", path};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->generate_addresses()[0];

  constexpr int kTokens = 3;
  const std::vector<int32_t> prompt = {5, 8, 13, 21};
  const std::string client_span = "b7ad6b7169203331";
  const std::string trace_id = "0af7651916cd43dd8448eb211c80319c";
  const std::vector<int32_t> traced = Generate(
      address, GreedyRequest("traced", prompt, kTokens),
      absl::StrCat("00-", trace_id, "-", client_span, "-01"));
  const std::vector<int32_t> untraced =
      Generate(address, GreedyRequest("untraced", prompt, kTokens), "");
  // Not sampled: no spans either.
  Generate(address, GreedyRequest("not-sampled", prompt, kTokens),
           "00-11111111111111111111111111111111-2222222222222222-00");
  EXPECT_EQ(traced, untraced);  // tracing does not change the answer
  ASSERT_TRUE((*cluster)->Stop().ok());

  const std::vector<nlohmann::json> attention = ReadSpans(files.at(NodeRole::kAttention));
  const std::vector<nlohmann::json> router = ReadSpans(files.at(NodeRole::kRouter));
  const std::vector<nlohmann::json> experts = ReadSpans(files.at(NodeRole::kExpert));
  for (const std::vector<nlohmann::json>* spans : {&attention, &router, &experts}) {
    ASSERT_FALSE(spans->empty());
    for (const nlohmann::json& span : *spans) {
      EXPECT_EQ(span["trace_id"], trace_id) << span.dump();
      EXPECT_LE(span["start_time_unix_nano"].get<int64_t>(),
                span["end_time_unix_nano"].get<int64_t>());
    }
  }

  // attention: one request span under the client's, steps under it (one per generated token:
  // the prefill gives the first).
  std::string request_span;
  std::set<std::string> steps;
  for (const nlohmann::json& span : attention) {
    if (span["name"] == "k3.generate") {
      EXPECT_TRUE(request_span.empty()) << "two request spans";
      request_span = span["span_id"];
      EXPECT_EQ(span["parent_span_id"], client_span);
      EXPECT_EQ(span["attributes"]["k3.generated_tokens"], kTokens);
    }
  }
  ASSERT_FALSE(request_span.empty());
  for (const nlohmann::json& span : attention) {
    if (span["name"] != "k3.step") continue;
    EXPECT_EQ(span["parent_span_id"], request_span);
    steps.insert(span["span_id"].get<std::string>());
  }
  EXPECT_EQ(steps.size(), static_cast<size_t>(kTokens));

  // router: every MoE layer of every step, under that step.
  std::map<std::string, int> layers_per_step;
  std::set<std::string> router_spans;
  for (const nlohmann::json& span : router) {
    EXPECT_EQ(span["name"], "k3.router.layer");
    const std::string parent = span["parent_span_id"];
    EXPECT_EQ(steps.count(parent), 1u) << span.dump();
    ++layers_per_step[parent];
    router_spans.insert(span["span_id"].get<std::string>());
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  for (const std::string& step : steps) {
    EXPECT_EQ(layers_per_step[step], config->NumMoeLayers()) << step;
  }

  // experts: under router spans, and every router span has at least one.
  std::set<std::string> answered;
  for (const nlohmann::json& span : experts) {
    EXPECT_EQ(span["name"], "k3.experts");
    const std::string parent = span["parent_span_id"];
    EXPECT_EQ(router_spans.count(parent), 1u) << span.dump();
    answered.insert(parent);
  }
  EXPECT_EQ(answered, router_spans);
}

}  // namespace
}  // namespace k3
