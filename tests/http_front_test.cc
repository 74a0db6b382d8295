// The HTTP front (`k3serve http`) of a real local cluster of k3-tiny, driven by real clients:
// curl for the server-sent-event wire format and the errors, the official `openai` npm package
// (tests/openai_client; `npm ci` there first, as tools/test.sh does) for chat completions
// streaming and not. Answers are checked against the single-process engine's greedy tokens,
// detokenized here. The openai test skips with "SKIPPED: reason" where Node.js or the package is
// missing; "external" keeps the result out of the cache, which cannot see node_modules.
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "launcher/local_cluster.h"
#include "proto/generate.grpc.pb.h"
#include "cluster/security.h"
#include "tests/cluster_testing.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/text_prompt.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

using nlohmann::json;
namespace v1 = k3serve::v1;

constexpr char kApiKey[] = "test-key-123";
constexpr char kClientScript[] = "tests/openai_client/chat.mjs";
constexpr char kAgentScript[] = "tests/openai_client/agent.mjs";
constexpr char kStructuredScript[] = "tests/openai_client/structured.mjs";
constexpr char kValidateScript[] = "tokenizer/testdata/validate_json_instances.py";
constexpr char kQuestion[] = "Why is the sky blue?";
constexpr int kMaxTokens = 12;
// The trace of the request ClosingANonStreamedRequestCancelsIt abandons.
constexpr char kCancelledTraceId[] = "5ce0e9a56015fec5aadfa328ae398115";

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string Quote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

class HttpFrontTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 11));
    const std::string key_file = TmpDir() + "/api-key";
    std::ofstream(key_file) << kApiKey << "\n";
    LocalClusterOptions options = TestClusterOptions(*model_, 1, 1, 1);
    options.http_port = 0;
    options.extra_args[NodeRole::kHttp] = {"--api-key-file", key_file};
    options.extra_args[NodeRole::kAttention] = {"--trace-file", TraceFile()};
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop().ok());
    }
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(cluster_, nullptr) << "the cluster did not start"; }

  static std::string TraceFile() { return TmpDir() + "/attention-spans.jsonl"; }

  static std::string Url(const std::string& path) {
    return absl::StrCat("http://", cluster_->http_address(), path);
  }

  // curl with the key; -i puts the status line and headers before the body.
  static std::string Curl(const std::string& path, const std::string& body,
                          const std::string& key = kApiKey) {
    return CommandOutput(absl::StrCat(
        "curl -sS -N -i ", key.empty() ? "" : absl::StrCat("-H 'Authorization: Bearer ", key, "' "),
        "-H 'Content-Type: application/json' ",
        body.empty() ? "" : absl::StrCat("--data-binary ", Quote(body), " "), Quote(Url(path))));
  }

  // The chat answer the front must give: the single-process engine's greedy tokens for the
  // rendered question, up to the end of the turn (or eos), detokenized without special tokens
  // (skip_special_tokens). `tokens` (if not null) gets how many tokens that is, specials included.
  static std::string ExpectedAnswer(int max_tokens, int* tokens_out = nullptr,
                                    bool thinking = false,
                                    const std::string& question = kQuestion,
                                    bool* special = nullptr) {
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(*model_);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    absl::StatusOr<std::vector<int32_t>> prompt =
        RenderChat(*tokenizer, {{.role = "user", .content = question}}, {.thinking = thinking});
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    absl::StatusOr<std::vector<std::vector<int32_t>>> tokens =
        SingleProcessTokens(*model_, {*prompt}, max_tokens);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    std::vector<int32_t> answer = (*tokens)[0];
    std::vector<int32_t> stops = {*TurnEndId(*tokenizer)};
    if (tokenizer->named_ids().eos.has_value()) stops.push_back(*tokenizer->named_ids().eos);
    answer.erase(std::find_first_of(answer.begin(), answer.end(), stops.begin(), stops.end()),
                 answer.end());
    // An empty answer would make the comparisons vacuous: the seed gives a few tokens first.
    EXPECT_GE(answer.size(), 2u);
    if (tokens_out != nullptr) *tokens_out = static_cast<int>(answer.size());
    // *special: whether the answer holds special tokens (the chat format's structure).
    if (special != nullptr) {
      *special = std::any_of(answer.begin(), answer.end(),
                             [&](int32_t id) { return tokenizer->IsSpecial(id); });
    }
    std::erase_if(answer, [&](int32_t id) { return tokenizer->IsSpecial(id); });
    return *DecodeForDisplay(*tokenizer, answer);
  }

  static std::string ChatBody(int max_tokens, bool stream) {
    return json{{"model", std::filesystem::path(*model_).filename().string()},
                {"messages", {{{"role", "user"}, {"content", kQuestion}}}},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"stream", stream},
                {"chat_template_kwargs", {{"thinking", false}}}}  // the answer is content
        .dump();
  }

  // Starts curl in the background (through a shell that prints its pid first) posting `body` to
  // `path` with the key and the `extra` options: curl's pid (0 if it did not start) and stdout.
  static std::pair<pid_t, FILE*> StartCurl(const std::string& path, const std::string& body,
                                           const std::string& extra = "") {
    static int bodies = 0;
    const std::string file = absl::StrCat(TmpDir(), "/body-", bodies++, ".json");
    std::ofstream(file) << body;
    const std::string command = absl::StrCat(
        "sh -c 'echo $$; exec curl -sS -N -H \"Authorization: Bearer ", kApiKey, "\" ", extra,
        " --data-binary @", file, " ", Url(path), "'");
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return {0, nullptr};
    char line[64];
    const pid_t pid = fgets(line, sizeof(line), pipe) != nullptr ? std::atoi(line) : 0;
    return {pid, pipe};
  }

  static int ActiveRequests() {
    auto stub = v1::K3Serve::NewStub(
        grpc::CreateChannel(cluster_->generate_addresses()[0], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ServerInfo info;
    const grpc::Status status = stub->GetServerInfo(&context, {}, &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return info.active_requests();
  }

  static std::string* model_;
  static LocalCluster* cluster_;
};
std::string* HttpFrontTest::model_ = nullptr;
LocalCluster* HttpFrontTest::cluster_ = nullptr;

// The body after curl -i's status line and headers.
std::string Body(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

TEST_F(HttpFrontTest, CurlStreamsServerSentEventsOfTheGreedyAnswer) {
  const std::string response = Curl("/v1/chat/completions", ChatBody(kMaxTokens, true));
  ASSERT_TRUE(absl::StartsWith(response, "HTTP/1.1 200")) << response;
  const std::string headers = absl::AsciiStrToLower(response.substr(0, response.find("\r\n\r\n")));
  EXPECT_TRUE(absl::StrContains(headers, "content-type: text/event-stream")) << headers;
  // Events are "data: ...\n\n"; the last is [DONE].
  const std::string body = Body(response);
  ASSERT_TRUE(absl::EndsWith(body, "data: [DONE]\n\n")) << body;
  std::string content;
  std::string finish_reason;
  int events = 0;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::StartsWith(event, "data: ")) << event;
    ASSERT_FALSE(absl::StrContains(event, "\n")) << event;
    if (event == "data: [DONE]") continue;
    const json chunk = json::parse(event.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& choice = chunk["choices"][0];
    if (events++ == 0) {
      EXPECT_EQ(choice["delta"]["role"], "assistant");
    }
    content += choice["delta"].value("content", "");
    if (!choice["finish_reason"].is_null()) finish_reason = choice["finish_reason"];
  }
  EXPECT_GE(events, 2);
  EXPECT_EQ(content, ExpectedAnswer(kMaxTokens));
  EXPECT_TRUE(finish_reason == "length" || finish_reason == "stop") << finish_reason;
}

// A client's traceparent header reaches the attention worker: its request span hangs under the
// client's span, in the client's trace. A malformed one starts no trace.
TEST_F(HttpFrontTest, ATraceparentHeaderTracesTheRequest) {
  const std::string trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string client_span = "00f067aa0ba902b7";
  const std::string body = R"({"prompt":[1,2,3],"max_tokens":2,"temperature":0})";
  const std::string traced = CommandOutput(absl::StrCat(
      "curl -sS -H 'Authorization: Bearer ", kApiKey, "' -H 'traceparent: 00-", trace_id, "-",
      client_span, "-01' --data-binary ", Quote(body), " ", Quote(Url("/v1/completions"))));
  ASSERT_TRUE(json::parse(traced).contains("choices")) << traced;
  const std::string malformed = CommandOutput(absl::StrCat(
      "curl -sS -H 'Authorization: Bearer ", kApiKey, "' -H 'traceparent: 00-zz-", client_span,
      "-01' --data-binary ", Quote(body), " ", Quote(Url("/v1/completions"))));
  ASSERT_TRUE(json::parse(malformed).contains("choices")) << malformed;

  int requests = 0;
  std::ifstream file(TraceFile());
  for (std::string line; std::getline(file, line);) {
    const json span = json::parse(line);
    if (span["trace_id"] == kCancelledTraceId) continue;  // the next test's
    EXPECT_EQ(span["trace_id"], trace_id) << line;
    if (span["name"] != "k3.generate") continue;
    ++requests;
    EXPECT_EQ(span["parent_span_id"], client_span) << line;
    EXPECT_EQ(span["attributes"]["k3.generated_tokens"], 2) << line;
  }
  EXPECT_EQ(requests, 1);
}

TEST_F(HttpFrontTest, CompletionsTakeTextOrTokenIdsAndCountUsage) {
  const json text = json::parse(Body(
      Curl("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":3,"temperature":0})")));
  ASSERT_TRUE(text.contains("choices")) << text;
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(*model_);
  ASSERT_TRUE(tokenizer.ok());
  const std::vector<int32_t> ids = *tokenizer->Encode("Once upon a time");
  EXPECT_EQ(text["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(text["usage"]["completion_tokens"], 3);
  // The same prompt as ids gives the same greedy text.
  const json by_ids = json::parse(Body(Curl(
      "/v1/completions", json{{"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}}.dump())));
  EXPECT_EQ(by_ids["choices"][0]["text"], text["choices"][0]["text"]);
}

TEST_F(HttpFrontTest, GrpcClientsGetTheSameAnswerThroughTheFront) {
  // k3serve.v1.K3Serve on the front's gRPC port, forwarded to the worker: a chat given as
  // messages streams the single-process engine's greedy tokens, ending at the turn's end.
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(*model_);
  ASSERT_TRUE(tokenizer.ok());
  absl::StatusOr<std::vector<int32_t>> prompt =
      RenderChat(*tokenizer, {{.role = "user", .content = kQuestion}}, {.thinking = false});
  ASSERT_TRUE(prompt.ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(*model_, {*prompt}, kMaxTokens);
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::vector<int32_t> answer = (*expected)[0];
  const auto turn_end = std::find(answer.begin(), answer.end(), *TurnEndId(*tokenizer));
  if (turn_end != answer.end()) answer.erase(turn_end + 1, answer.end());

  auto stub = v1::K3Serve::NewStub(
      grpc::CreateChannel(cluster_->front_grpc_address(), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  v1::ChatMessage* message = request.add_messages();
  message->set_role("user");
  message->set_content(kQuestion);
  request.mutable_sampling()->set_max_new_tokens(kMaxTokens);
  request.mutable_sampling()->set_temperature(0);
  for (const char* key : {"", kApiKey}) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    AddBearer(key, &context);
    auto reader = stub->Generate(&context, request);
    std::vector<int32_t> tokens;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      tokens.insert(tokens.end(), response.chunk().token_ids().begin(),
                    response.chunk().token_ids().end());
    }
    const grpc::Status status = reader->Finish();
    if (std::string(key).empty()) {
      // The front's clients need its API key, on gRPC as on HTTP.
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      continue;
    }
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(tokens, answer);
  }
}

TEST_F(HttpFrontTest, StopStringsCutTheTextAcrossTokens) {
  const std::string request = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0)";
  const json full = json::parse(Body(Curl("/v1/completions", request + "}")));
  const std::string text = full["choices"][0]["text"];
  // The second half of the text, from a character boundary: it spans several tokens.
  size_t cut = text.size() / 2;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  ASSERT_GT(cut, 0u) << text;
  const std::string stop = text.substr(cut);
  const std::string expected = text.substr(0, text.find(stop));
  const std::string with_stop = request + ",\"stop\":" + json(stop).dump();
  const json cut_body = json::parse(Body(Curl("/v1/completions", with_stop + "}")));
  EXPECT_EQ(cut_body["choices"][0]["text"], expected);
  EXPECT_EQ(cut_body["choices"][0]["finish_reason"], "stop");
  // Streamed, no event carries a piece of the stop string.
  std::string streamed;
  for (absl::string_view event :
       absl::StrSplit(Body(Curl("/v1/completions", with_stop + ",\"stream\":true}")), "\n\n",
                      absl::SkipEmpty())) {
    if (event == "data: [DONE]") continue;
    streamed += json::parse(event.substr(6))["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, expected);
  // The front cancelled the generation at the stop string: the worker holds nothing.
  EXPECT_TRUE(WaitFor([] { return ActiveRequests() == 0; }, absl::Seconds(30)));
}

TEST_F(HttpFrontTest, ErrorsHaveOpenAisShapeAndStatus) {
  struct Case {
    std::string path, body, key;
    int status;
    std::string type;
  };
  const Case cases[] = {
      {"/v1/chat/completions", "{not json", kApiKey, 400, "invalid_request_error"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":0})", kApiKey,
       400, "invalid_request_error"},
      {"/v1/chat/completions", ChatBody(2, false), "", 401, "authentication_error"},
      {"/v1/chat/completions", ChatBody(2, false), "wrong", 401, "authentication_error"},
      {"/v1/nothing", "", kApiKey, 404, "not_found_error"},
      {"/v1/completions", R"({"prompt":"x","model":"gpt-4"})", kApiKey, 404, "not_found_error"},
  };
  for (const Case& c : cases) {
    const std::string response = Curl(c.path, c.body, c.key);
    EXPECT_TRUE(absl::StartsWith(response, absl::StrCat("HTTP/1.1 ", c.status)))
        << c.path << " " << c.body << ":\n"
        << response;
    const json body = json::parse(Body(response), nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << response;
    EXPECT_EQ(body["error"]["type"], c.type) << response;
    EXPECT_TRUE(body["error"]["message"].is_string()) << response;
    EXPECT_TRUE(body["error"].contains("param") && body["error"].contains("code")) << response;
  }
}

TEST_F(HttpFrontTest, ClosingTheStreamFreesTheRequestOnTheWorker) {
  ASSERT_EQ(ActiveRequests(), 0);
  // The events of an answer far longer than the test.
  const auto [curl, pipe] = StartCurl("/v1/chat/completions", ChatBody(4096, true));
  ASSERT_GT(curl, 0);
  char line[65536];
  ASSERT_NE(fgets(line, sizeof(line), pipe), nullptr);  // the first event
  EXPECT_TRUE(absl::StartsWith(line, "data: {")) << line;
  EXPECT_EQ(ActiveRequests(), 1);  // still generating
  kill(curl, SIGKILL);
  pclose(pipe);
  // The front's next write fails, it cancels the gRPC call, the worker frees the request.
  EXPECT_TRUE(WaitFor([] { return ActiveRequests() == 0; }, absl::Seconds(30)));
}

// Fields a request leaves out take OpenAI's defaults: temperature 1 (two seeds give two answers;
// greedy would give one) and max_tokens up to what the worker allows (not 16: a stream without
// max_tokens is still going after 20 events, each of at least one token).
TEST_F(HttpFrontTest, UnsetFieldsTakeOpenAisDefaults) {
  auto text = [](int seed) {
    const json body = json::parse(Body(Curl(
        "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"seed", seed}}
                               .dump())));
    return body["choices"][0]["text"].get<std::string>();
  };
  EXPECT_NE(text(1), text(2));
  EXPECT_EQ(text(1), text(1));  // the seed, not chance, made them differ

  const auto [curl, pipe] =
      StartCurl("/v1/completions", R"({"prompt":"Once upon a time","stream":true})");
  ASSERT_GT(curl, 0);
  char line[65536];
  int events = 0;
  while (events < 20 && fgets(line, sizeof(line), pipe) != nullptr) {
    if (!absl::StartsWith(line, "data: {")) continue;
    const json chunk = json::parse(std::string(line).substr(6));
    ASSERT_TRUE(chunk["choices"][0]["finish_reason"].is_null()) << line;
    ++events;
  }
  kill(curl, SIGKILL);
  pclose(pipe);
  EXPECT_EQ(events, 20);
  EXPECT_TRUE(WaitFor([] { return ActiveRequests() == 0; }, absl::Seconds(30)));
}

// Special tokens add nothing to the text unless skip_special_tokens is false: the same sampled
// answer (same seed) with them is the answer without them plus their names, which the test reads
// off the tokenizer.
TEST_F(HttpFrontTest, SpecialTokensAreSkippedInText) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(*model_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto answer = [](int seed, bool skip) {
    return json::parse(Body(Curl("/v1/completions",
                                 json{{"prompt", "Once upon a time"},
                                      {"max_tokens", 48},
                                      {"temperature", 2},
                                      {"seed", seed},
                                      {"logprobs", 0},
                                      {"skip_special_tokens", skip}}
                                     .dump())))["choices"][0];
  };
  int with_specials = 0;
  for (int seed = 1; seed <= 10 && with_specials == 0; ++seed) {
    const json raw = answer(seed, false);
    for (const json& token : raw["logprobs"]["tokens"]) {
      with_specials += tokenizer->SpecialTokenId(token.get<std::string>()).has_value();
    }
    if (with_specials == 0) continue;
    const json skipped = answer(seed, true);
    EXPECT_EQ(skipped["logprobs"]["tokens"], raw["logprobs"]["tokens"]);  // the same answer
    std::string text = raw["text"];
    for (const json& token : raw["logprobs"]["tokens"]) {
      const std::string name = token;
      if (!tokenizer->SpecialTokenId(name).has_value()) continue;
      const size_t at = text.find(name);
      ASSERT_NE(at, std::string::npos) << name << " is not in " << raw;
      text.erase(at, name.size());
    }
    EXPECT_EQ(skipped["text"], text) << raw;
  }
  EXPECT_GT(with_specials, 0) << "no seed sampled a special token: the test checked nothing";
}

// A non-streamed request whose client goes away is cancelled at its next token, not run to its
// max_tokens: the worker's span of it (traced for this) counts fewer tokens than it asked for.
TEST_F(HttpFrontTest, ClosingANonStreamedRequestCancelsIt) {
  ASSERT_EQ(ActiveRequests(), 0);
  constexpr int kAsked = 4096;
  const auto [curl, pipe] =
      StartCurl("/v1/chat/completions", ChatBody(kAsked, false),
                absl::StrCat("-H \"traceparent: 00-", kCancelledTraceId, "-00f067aa0ba902b7-01\""));
  ASSERT_GT(curl, 0);
  ASSERT_TRUE(WaitFor([] { return ActiveRequests() == 1; }, absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(200));  // a few tokens
  kill(curl, SIGKILL);
  pclose(pipe);
  EXPECT_TRUE(WaitFor([] { return ActiveRequests() == 0; }, absl::Seconds(60)));
  int spans = 0;
  std::ifstream file(TraceFile());
  for (std::string span_line; std::getline(file, span_line);) {
    const json span = json::parse(span_line);
    if (span["trace_id"] != kCancelledTraceId || span["name"] != "k3.generate") continue;
    ++spans;
    EXPECT_LT(span["attributes"]["k3.generated_tokens"].get<int>(), kAsked) << span_line;
  }
  EXPECT_EQ(spans, 1);
}

// Why the openai client tests cannot run here, or "".
std::string OpenAiClientMissing() {
  if (std::system("node --version >/dev/null 2>&1") != 0) return "Node.js is missing";
  const std::filesystem::path sources = std::filesystem::canonical(kClientScript).parent_path();
  if (!std::filesystem::exists(sources / "node_modules" / "openai")) {
    return absl::StrCat("the openai package is not installed: run `npm ci` in ", sources.string());
  }
  return "";
}

#define SKIP_WITHOUT_OPENAI_CLIENT()                      \
  if (const std::string reason = OpenAiClientMissing(); \
      !reason.empty()) {                                  \
    std::cout << "SKIPPED: " << reason << "\n";          \
    GTEST_SKIP() << reason;                               \
  }

// Checks `instance` (JSON text) against `schema` with python3-jsonschema where it is installed,
// else that it is JSON with the schema's properties.
void ExpectValidates(const json& schema, const std::string& instance) {
  const json parsed = json::parse(instance, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << instance;
  for (const auto& [key, property] : schema["properties"].items()) {
    EXPECT_TRUE(parsed.contains(key)) << instance;
  }
  if (std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) return;
  const std::string pairs = TmpDir() + "/instances.jsonl";
  std::ofstream(pairs) << json{{"schema", schema}, {"instance", instance}}.dump() << "\n";
  EXPECT_EQ(std::system(absl::StrCat("python3 ", kValidateScript, " ", pairs).c_str()), 0)
      << instance;
}

TEST_F(HttpFrontTest, OpenAiClientChatsStreamingAndNot) {
  SKIP_WITHOUT_OPENAI_CLIENT();
  const std::string out =
      CommandOutput(absl::StrCat("node ", kClientScript, " ", Quote(Url("/v1")), " ", kApiKey, " ",
                                 Quote(std::filesystem::path(*model_).filename().string()), " ",
                                 Quote(kQuestion), " ", kMaxTokens));
  const json result = json::parse(out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out;
  const std::string expected = ExpectedAnswer(kMaxTokens);
  EXPECT_EQ(result["content"], expected);
  EXPECT_EQ(result["stream_content"], expected);
  EXPECT_EQ(result["finish_reason"], result["stream_finish_reason"]);
  EXPECT_GT(result["stream_chunks"].get<int>(), 1);
  EXPECT_EQ(result["usage"], result["stream_usage"]);
  EXPECT_GT(result["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(result["wrong_key_status"], 401);

  // n=2 with logprobs, whole and streamed: each choice is the greedy answer, with one entry per
  // generated token (the turn end excluded) whose logprob, greedy, is the most likely one's.
  int answer_tokens = 0;
  ExpectedAnswer(kMaxTokens, &answer_tokens);
  for (const char* key : {"choices", "stream_choices"}) {
    const json& choices = result[key];
    ASSERT_EQ(choices.size(), 2u) << key << ": " << out;
    for (int i = 0; i < 2; ++i) {
      const json& choice = choices[i];
      if (choice.contains("index")) {
        EXPECT_EQ(choice["index"], i);
      }
      EXPECT_EQ(choice["content"], expected) << key << " " << i;
      EXPECT_EQ(choice["finish_reason"], result["finish_reason"]) << key << " " << i;
      const json& logprobs = choice["logprobs"];
      ASSERT_EQ(logprobs.size(), static_cast<size_t>(answer_tokens)) << key << " " << i;
      for (const json& token : logprobs) {
        const json& top = token["top_logprobs"];
        ASSERT_EQ(top.size(), 3u) << token;
        EXPECT_LE(token["logprob"].get<double>(), 0.0) << token;
        EXPECT_EQ(token["token"], top[0]["token"]) << token;
        EXPECT_DOUBLE_EQ(token["logprob"].get<double>(), top[0]["logprob"].get<double>());
        double mass = 0;
        for (size_t k = 0; k < top.size(); ++k) {
          if (k > 0) {
            EXPECT_GE(top[k - 1]["logprob"], top[k]["logprob"]) << token;
          }
          mass += std::exp(top[k]["logprob"].get<double>());
        }
        EXPECT_LE(mass, 1.0 + 1e-5) << token;
      }
    }
  }
  for (size_t t = 0; t < static_cast<size_t>(answer_tokens); ++t) {
    const json& whole = result["choices"][0]["logprobs"][t];
    const json& streamed = result["stream_choices"][1]["logprobs"][t];
    EXPECT_EQ(whole["token"], streamed["token"]);
    EXPECT_NEAR(whole["logprob"].get<double>(), streamed["logprob"].get<double>(), 1e-3);
  }
  EXPECT_EQ(result["choices_usage"]["completion_tokens"],
            2 * result["usage"]["completion_tokens"].get<int>());
}

// Issue 23: tools, tool_choice, tool calls and tool results, reasoning_content and
// response_format were ignored or refused before.
TEST_F(HttpFrontTest, OpenAiClientCallsToolsReasonsAndAnswersInJson) {
  SKIP_WITHOUT_OPENAI_CLIENT();
  const std::string out =
      CommandOutput(absl::StrCat("node ", kAgentScript, " ", Quote(Url("/v1")), " ", kApiKey, " ",
                                 Quote(std::filesystem::path(*model_).filename().string())));
  const json result = json::parse(out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out;
  const json parameters = json::parse(R"({"type":"object","additionalProperties":false,
      "required":["city","days"],"properties":{"city":{"type":"string","maxLength":8},
      "days":{"type":"integer"}}})");
  for (const char* mode : {"tools", "tools_stream"}) {
    SCOPED_TRACE(mode);
    const json& got = result[mode];
    EXPECT_EQ(got["finish_reason"], "tool_calls");
    ASSERT_EQ(got["calls"].size(), 1u) << got.dump();
    const json& call = got["calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    EXPECT_EQ(call["function"]["name"], "get_weather");
    ExpectValidates(parameters, call["function"]["arguments"].get<std::string>());
    // The answer after the tool's result: free text, its prompt the whole round trip.
    EXPECT_TRUE(got["final_content"].is_string());
    EXPECT_EQ(got["final_finish_reason"], "length");
  }
  EXPECT_EQ(result["tools"]["calls"][0]["function"], result["tools_stream"]["calls"][0]["function"]);
  EXPECT_EQ(result["tools"]["final_prompt_tokens"], result["tools_stream"]["final_prompt_tokens"]);

  // Thinking on by default: the greedy answer is reasoning (the model never closes its think
  // section here), the same streamed and not.
  bool special = false;
  const std::string thought =
      ExpectedAnswer(12, nullptr, /*thinking=*/true, "What is the weather in Paris?", &special);
  const json& reasoning = result["reasoning"];
  if (!special) {
    EXPECT_EQ(reasoning["reasoning_content"], thought);
  }
  EXPECT_FALSE(reasoning["reasoning_content"].get<std::string>().empty());
  EXPECT_EQ(result["reasoning_stream"]["reasoning_content"], reasoning["reasoning_content"]);
  EXPECT_EQ(result["reasoning_stream"]["content"], reasoning["content"].is_null()
                                                       ? json("")
                                                       : reasoning["content"]);

  EXPECT_EQ(result["json_schema"]["finish_reason"], "stop");
  ExpectValidates(result["json_schema"]["schema"],
                  result["json_schema"]["content"].get<std::string>());
}

// One request by curl: its HTTP status, seconds and body. `args` are curl's options for it.
struct Timed {
  int status = 0;
  double seconds = 0;
  std::string body;
};
Timed CurlTimed(const std::string& args) {
  const std::string body_file = TmpDir() + "/timed-body";
  std::remove(body_file.c_str());
  const std::string out = CommandOutput(
      absl::StrCat("curl -sS -o ", body_file, " -w '%{http_code} %{time_total}' ", args));
  Timed timed;
  std::vector<std::string> parts = absl::StrSplit(out, ' ');
  if (parts.size() == 2) {
    timed.status = std::atoi(parts[0].c_str());
    timed.seconds = std::atof(parts[1].c_str());
  }
  std::ifstream file(body_file);
  timed.body.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  return timed;
}

// Issue 38: each soft spot of the API is answered at once (within 100 ms), correctly, naming the
// request's own parameter, and the server then serves the next request.
TEST_F(HttpFrontTest, SoftSpotsAreAnsweredAtOnce) {
  const std::string auth = absl::StrCat("-H 'Authorization: Bearer ", kApiKey, "' ");
  const std::string chat = Quote(Url("/v1/chat/completions"));
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  struct Case {
    std::string name;
    std::string args;
    int status;
    std::string param;  // "-": the body is not an OpenAI error
  };
  const Case cases[] = {
      {"POST without a body", auth + "-X POST " + chat, 411, ""},
      {"PUT without a body", auth + "-X PUT " + chat, 411, ""},
      {"max_tokens beyond the limit",
       auth + "--data-binary " + Quote(absl::StrCat("{", user, R"(,"max_tokens":1000000000})")) +
           " " + chat,
       400, "max_tokens"},
      {"max_completion_tokens beyond the limit",
       auth + "--data-binary " +
           Quote(absl::StrCat("{", user, R"(,"max_completion_tokens":1000000000})")) + " " + chat,
       400, "max_completion_tokens"},
      {"a tool message without tool_call_id",
       auth + "--data-binary " +
           Quote(R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"1"}]})") +
           " " + chat,
       400, "messages"},
      {"a tool message answering an unknown call",
       auth + "--data-binary " +
           Quote(R"({"messages":[{"role":"user","content":"x"},{"role":"tool",
                 "tool_call_id":"call_nope","content":"1"}]})") +
           " " + chat,
       400, "messages"},
      {"presence_penalty 5",
       auth + "--data-binary " + Quote(absl::StrCat("{", user, R"(,"presence_penalty":5})")) +
           " " + chat,
       400, "presence_penalty"},
      {"echo on completions",
       auth + "--data-binary " + Quote(R"({"prompt":"hi","echo":true})") + " " +
           Quote(Url("/v1/completions")),
       400, "echo"},
      {"suffix on completions",
       auth + "--data-binary " + Quote(R"({"prompt":"hi","suffix":"x"})") + " " +
           Quote(Url("/v1/completions")),
       400, "suffix"},
      {"a thinking budget max_tokens cannot hold",
       auth + "--data-binary " +
           Quote(absl::StrCat("{", user, R"(,"max_tokens":40,"thinking_budget":39,)",
                              R"("response_format":{"type":"json_object"}})")) +
           " " + chat,
       400, "max_tokens"},
      {"/healthz on the API port, no key", Quote(Url("/healthz")), 200, "-"},
      {"/readyz on the API port, no key", Quote(Url("/readyz")), 200, "-"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Timed got = CurlTimed(c.args);
    EXPECT_EQ(got.status, c.status) << got.body;
    EXPECT_LT(got.seconds, 0.1);
    if (c.param != "-") {
      const json error = json::parse(got.body, nullptr, false);
      ASSERT_FALSE(error.is_discarded()) << got.body;
      EXPECT_EQ(error["error"]["param"], c.param.empty() ? json(nullptr) : json(c.param))
          << got.body;
      EXPECT_EQ(error["error"]["type"], "invalid_request_error") << got.body;
    }
    const std::string next = Curl("/v1/chat/completions", ChatBody(2, false));
    EXPECT_TRUE(absl::StartsWith(next, "HTTP/1.1 200")) << next;
  }
}

// Issue 38: structured output never comes back empty, unparseable or off its schema, with
// thinking on (K3's default) or off, streamed or not, over seeds: K3_STRUCTURED_REQUESTS
// requests (default 28, two per combination, as CI runs it; the issue's acceptance run is 400:
// `--test_env=K3_STRUCTURED_REQUESTS=400`), each sent whole and streamed, checked here and by
// python3-jsonschema (code points counted by Python).
TEST_F(HttpFrontTest, StructuredOutputIsAlwaysWholeAndValid) {
  SKIP_WITHOUT_OPENAI_CLIENT();
  if (std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) {
    std::cout << "SKIPPED: python3-jsonschema is missing (tools/install_deps.sh installs it)\n";
    GTEST_SKIP();
  }
  const char* count_env = std::getenv("K3_STRUCTURED_REQUESTS");
  const int count = count_env != nullptr ? std::atoi(count_env) : 28;
  const std::string out = CommandOutput(
      absl::StrCat("node ", kStructuredScript, " ", Quote(Url("/v1")), " ", kApiKey, " ",
                   Quote(std::filesystem::path(*model_).filename().string()), " ", count, " 256"));
  const json result = json::parse(out, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << out;
  const json& results = result["results"];
  ASSERT_EQ(results.size(), static_cast<size_t>(count));
  // Kept with the test's outputs (bazel-testlogs/.../outputs.zip) where Bazel gives a folder.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string pairs = absl::StrCat(outputs != nullptr ? outputs : TmpDir(), "/structured.jsonl");
  std::ofstream file(pairs);
  int empty = 0, unparseable = 0, different = 0, thought = 0, reasoned = 0;
  for (const json& r : results) {
    SCOPED_TRACE(r.dump());
    ASSERT_FALSE(r.contains("error"));
    const bool call = r["case"] == "required" || r["case"] == "named_function";
    for (const char* mode : {"whole", "stream"}) {
      const json& answer = r[mode];
      const std::string instance = answer["instance"].get<std::string>();
      empty += instance.empty();
      unparseable += !instance.empty() && json::parse(instance, nullptr, false).is_discarded();
      EXPECT_EQ(answer["finish_reason"], call ? "tool_calls" : "stop") << mode;
      EXPECT_EQ(answer["calls"], call ? 1 : 0) << mode;
      if (r.contains("expected_name")) {
        EXPECT_EQ(answer["name"], r["expected_name"]) << mode;
      }
      file << json{{"schema", r["schema"]}, {"instance", instance}}.dump() << "\n";
    }
    different += r["whole"] != r["stream"];
    thought += r["thinking"].get<bool>();
    // Thinking on: reasoning, then the answer; off: no reasoning.
    const bool reasoning = !r["whole"]["reasoning"].get<std::string>().empty();
    if (!r["thinking"].get<bool>()) {
      EXPECT_FALSE(reasoning);
    }
    reasoned += reasoning;
  }
  file.close();
  EXPECT_EQ(empty, 0);
  EXPECT_EQ(unparseable, 0);
  EXPECT_EQ(different, 0);
  EXPECT_GT(thought, 0);
  EXPECT_GT(reasoned, 0);  // the think sections were not all closed at once
  EXPECT_EQ(std::system(absl::StrCat("python3 ", kValidateScript, " ", pairs).c_str()), 0)
      << "see the INVALID lines above";
  std::cout << count << " structured requests (x2: whole and streamed) in "
            << result["seconds"] << " s\n";
}

}  // namespace
}  // namespace k3
