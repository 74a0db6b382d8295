// `k3serve serve` as a real process: concurrent requests over its gRPC API and its OpenAI HTTP
// API (curl) must give, for every one of 20 prompts, the greedy tokens that `k3serve generate --model`
// prints for it (a separate process: the single-process path), and the same as the test's own
// single-process engine; health, metrics and a clean exit on SIGTERM.
#include <stdio.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/grpc_server.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/serve_process.h"
#include "tokenizer/text_prompt.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

using nlohmann::json;

constexpr int kMaxNewTokens = 10;
constexpr int kPrompts = 20;

std::vector<int32_t> ParseIds(absl::string_view line) {
  std::vector<int32_t> ids;
  for (absl::string_view word :
       absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty())) {
    int32_t id;
    EXPECT_TRUE(absl::SimpleAtoi(word, &id)) << line;
    ids.push_back(id);
  }
  return ids;
}

TEST(ServeTest, ConcurrentGrpcAndHttpRequestsGiveTheSingleProcessGreedyTokens) {
  const std::string model = RandomCheckpointDir("k3-tiny", 21);
  const std::string binary = std::filesystem::absolute("k3serve").string();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(model);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<std::vector<int32_t>> prompts =
      TestPrompts(kPrompts, static_cast<int>(tokenizer->vocab_size()), 5);

  // What `k3serve generate --model` prints for each prompt, and the test's own engine's answer.
  std::vector<std::vector<int32_t>> expected;
  for (const std::vector<int32_t>& prompt : prompts) {
    expected.push_back(ParseIds(CommandOutput(
        absl::StrCat(binary, " generate --model ", model, " --tokens ", absl::StrJoin(prompt, ","),
                     " --max-new-tokens ", kMaxNewTokens, " --temperature 0"))));
    ASSERT_FALSE(expected.back().empty());
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> engine =
      SingleProcessTokens(model, prompts, kMaxNewTokens);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(*engine, expected);

  ServeProcess serve;
  ASSERT_TRUE(serve.Start(binary, model, {"--max-new-tokens-limit", "64"}).ok());

  // Every prompt at once over gRPC and over HTTP, twice each.
  constexpr int kRounds = 2;
  std::vector<std::vector<int32_t>> grpc_tokens(kRounds * kPrompts);
  std::vector<std::string> grpc_errors(kRounds * kPrompts);
  std::vector<std::string> http_bodies(kRounds * kPrompts);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRounds * kPrompts; ++i) {
    const std::vector<int32_t>& prompt = prompts[i % kPrompts];
    clients.emplace_back([&, i, prompt] {
      absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
          serve.generate_address(), GreedyRequest(absl::StrCat("grpc-", i), prompt, kMaxNewTokens),
          absl::Seconds(60));
      if (outcome.ok()) {
        grpc_tokens[i] = outcome->tokens;
      } else {
        grpc_errors[i] = outcome.status().ToString();
      }
    });
    clients.emplace_back([&, i, prompt] {
      const json body = {{"prompt", prompt}, {"max_tokens", kMaxNewTokens}, {"temperature", 0}};
      http_bodies[i] = CommandOutput(
          absl::StrCat("curl -sS -m 60 -H 'Content-Type: application/json' ", "--data-binary '",
                       body.dump(), "' http://", serve.http_address(), "/v1/completions"));
    });
  }
  for (std::thread& client : clients) client.join();

  const std::vector<int32_t> eos = {*tokenizer->named_ids().eos};
  for (int i = 0; i < kRounds * kPrompts; ++i) {
    const std::vector<int32_t>& want = expected[i % kPrompts];
    EXPECT_EQ(grpc_errors[i], "");
    EXPECT_EQ(grpc_tokens[i], want) << "gRPC request " << i;
    // The HTTP API ends at eos (counted in the usage, not part of the text) and leaves special
    // tokens out.
    const auto end = std::find_first_of(want.begin(), want.end(), eos.begin(), eos.end());
    const size_t completion_tokens = end - want.begin() + (end != want.end() ? 1 : 0);
    std::vector<int32_t> answer(want.begin(), end);
    std::erase_if(answer, [&](int32_t id) { return tokenizer->IsSpecial(id); });
    const json reply = json::parse(http_bodies[i], nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(reply.contains("choices")) << http_bodies[i];
    EXPECT_EQ(reply["choices"][0]["text"], *DecodeForDisplay(*tokenizer, answer))
        << "HTTP request " << i;
    EXPECT_EQ(reply["usage"]["completion_tokens"], completion_tokens) << "HTTP request " << i;
  }

  // Health on the gRPC port, one metrics registry for both APIs.
  absl::StatusOr<bool> serving =
      CheckServing(grpc::CreateChannel(serve.generate_address(), grpc::InsecureChannelCredentials()),
                   "k3serve.v1.K3Serve", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  const std::string metrics =
      CommandOutput(absl::StrCat("curl -sS http://", serve.metrics_address(), "/metrics"));
  EXPECT_NE(metrics.find(absl::StrCat("k3_http_responses_total{status=\"200\"} ",
                                      kRounds * kPrompts)),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("k3_attention_step_seconds"), std::string::npos) << metrics;
  EXPECT_EQ(CommandOutput(absl::StrCat("curl -sS -o /dev/null -w '%{http_code}' http://",
                                       serve.metrics_address(), "/healthz")),
            "200");

  EXPECT_EQ(serve.Stop(), 0);
}

// Bad flags are refused before anything loads.
TEST(ServeTest, RefusesAMissingModelAndUnknownFlags) {
  const std::string binary = std::filesystem::absolute("k3serve").string();
  EXPECT_NE(system((binary + " serve --http-port 0 2>/dev/null").c_str()), 0);
  EXPECT_NE(system((binary + " serve --model /nonexistent --port 0 --http-port 0 2>/dev/null")
                       .c_str()),
            0);
  EXPECT_NE(system((binary + " serve --model x --server y:1 2>/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace k3
