// Security of the service end to end, with certificates made by openssl at test time:
// - a real cluster of processes (`k3serve local`'s LocalCluster: coordinator, attention worker,
//   router, expert worker, HTTP front) with mutual TLS on every gRPC endpoint and a bearer token
//   on the public API: it generates the single-process tokens for a client with the CA, a client
//   certificate and the token, and refuses clients without one of them; the HTTP front answers
//   401 without the token and generates with it; `k3serve generate --server` takes the flags;
// - an attention server in process: the per-client stream limit (RESOURCE_EXHAUSTED) and the
//   request size limit.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "attention_nodes/server/attention_server.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/grpc_server.h"
#include "cluster/security.h"
#include "cluster/test_certs.h"
#include "cluster/test_wait.h"
#include "engine/local_routed_moe.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "launcher/local_cluster.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/generate.grpc.pb.h"
#include "tests/cluster_testing.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

constexpr char kToken[] = "s3cret-token";

std::string TmpDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return base != nullptr ? base : "/tmp";
}

std::string TokenFile(const std::string& name, const std::string& token) {
  const std::string path = TmpDir() + "/" + name;
  std::ofstream(path) << token << "\n";
  return path;
}

GenerateClientOptions Client(const TlsFlags& tls, const std::string& token) {
  GenerateClientOptions client;
  absl::StatusOr<ClientTls> loaded = LoadClientTls(tls);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (loaded.ok()) client.tls = *loaded;
  client.auth_token = token;
  return client;
}

// Runs `command` with sh; its stdout and stderr together, and its exit status.
std::pair<std::string, int> Shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

class SecureClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TestCerts> certs = MakeTestCerts(TmpDir() + "/certs");
    if (!certs.ok()) {
      skip_ = std::string(certs.status().message());
      ASSERT_TRUE(absl::IsUnavailable(certs.status())) << certs.status();
      return;
    }
    certs_ = new TestCerts(*certs);
    model_ = new std::string(RandomCheckpointDir("k3-tiny", 7));
    LocalClusterOptions options = TestClusterOptions(*model_, 1, 1, 1);
    options.http_port = 0;
    options.tls = certs_->Mutual();
    options.auth_token_file = TokenFile("token", kToken);
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    binary_ = new std::string(options.binary);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_NE(cluster_, nullptr);
    address_ = cluster_->generate_addresses()[0];
  }

  static inline std::string skip_;
  static inline TestCerts* certs_ = nullptr;
  static inline std::string* model_ = nullptr;
  static inline std::string* binary_ = nullptr;
  static inline LocalCluster* cluster_ = nullptr;
  std::string address_;
};

TEST_F(SecureClusterTest, GeneratesForAClientWithCaCertificateAndToken) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  absl::StatusOr<std::vector<std::vector<int32_t>>> expected =
      SingleProcessTokens(*model_, {prompt}, 6);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<GenerateOutcome> outcome =
      GenerateOverGrpc(Client(certs_->Mutual(), kToken), address_,
                       GreedyRequest("secure", prompt, 6), absl::Seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, (*expected)[0]);
}

TEST_F(SecureClusterTest, RefusesClientsWithoutCaCertificateOrToken) {
  const v1::GenerateRequest request = GreedyRequest("", {1, 2, 3}, 2);
  const absl::Duration timeout = absl::Seconds(10);
  struct Case {
    const char* what;
    TlsFlags tls;
    std::string token;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"plaintext", TlsFlags(), kToken, absl::StatusCode::kUnavailable},
      {"no CA (system roots)", {certs_->cert, certs_->key, "", ""}, kToken,
       absl::StatusCode::kUnavailable},
      {"another CA", {certs_->cert, certs_->key, certs_->other_ca, ""}, kToken,
       absl::StatusCode::kUnavailable},
      {"no client certificate", {"", "", certs_->ca, ""}, kToken, absl::StatusCode::kUnavailable},
      {"no token", certs_->Mutual(), "", absl::StatusCode::kUnauthenticated},
      {"wrong token", certs_->Mutual(), "s3cret-tokeN", absl::StatusCode::kUnauthenticated},
  };
  for (const Case& c : cases) {
    absl::StatusOr<GenerateOutcome> outcome =
        GenerateOverGrpc(Client(c.tls, c.token), address_, request, timeout);
    EXPECT_EQ(outcome.status().code(), c.code) << c.what << ": " << outcome.status();
  }
  // Health checks need TLS but no token.
  absl::StatusOr<ClientTls> tls = LoadClientTls(certs_->Mutual());
  ASSERT_TRUE(tls.ok());
  absl::StatusOr<bool> serving =
      CheckServing(tls->Connect(address_), "k3serve.v1.K3Serve", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
}

// The front serves HTTPS with the cluster's certificate, wants the token and forwards it.
TEST_F(SecureClusterTest, HttpFrontWantsTheTokenAndForwardsIt) {
  const std::string http = cluster_->http_address();
  ASSERT_FALSE(http.empty());
  const size_t colon = http.rfind(':');
  httplib::SSLClient client(http.substr(0, colon), std::atoi(http.c_str() + colon + 1));
  client.set_ca_cert_path(certs_->ca.c_str());
  client.enable_server_certificate_verification(true);
  client.set_read_timeout(30, 0);
  const std::string body = R"({"prompt":[1,2,3],"max_tokens":3,"temperature":0})";
  httplib::Result missing = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401) << missing->body;
  httplib::Result wrong = client.Post(
      "/v1/completions", httplib::Headers{{"Authorization", "Bearer guess"}}, body,
      "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401) << wrong->body;
  httplib::Result ok = client.Post(
      "/v1/completions", httplib::Headers{{"Authorization", absl::StrCat("Bearer ", kToken)}},
      body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(absl::StrContains(ok->body, "\"completion_tokens\":3")) << ok->body;
}

TEST_F(SecureClusterTest, GenerateCommandTakesTheTlsFlagsAndToken) {
  const std::string tls =
      absl::StrCat(" --tls-cert ", certs_->cert, " --tls-key ", certs_->key, " --tls-ca ",
                   certs_->ca);
  const std::string base = absl::StrCat(*binary_, " generate --server ", address_,
                                        " --tokens 1,2,3 --max-new-tokens 2 --temperature 0");
  const auto [out, status] =
      Shell(absl::StrCat(base, tls, " --auth-token-file ", TokenFile("token", kToken)));
  EXPECT_EQ(status, 0) << out;
  const auto [refused_out, refused] = Shell(base + tls);
  EXPECT_EQ(refused, 1) << refused_out;
  EXPECT_TRUE(absl::StrContains(refused_out, "UNAUTHENTICATED")) << refused_out;
  const auto [bad_out, bad] = Shell(base + " --tls-ca /nonexistent/ca.pem");
  EXPECT_NE(bad, 0) << bad_out;
  EXPECT_TRUE(absl::StrContains(bad_out, "--tls-ca /nonexistent/ca.pem")) << bad_out;
}

// LocalRoutedMoe whose steps wait while `hold` is set; counts the steps begun.
class HeldMoe final : public RoutedMoe {
 public:
  explicit HeldMoe(const ModelWeights* weights) : local_(weights) {}
  absl::Status Begin(int layer, const float* x, int64_t tokens) override {
    absl::MutexLock lock(&mu_);
    ++begun_;
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_));
    return local_.Begin(layer, x, tokens);
  }
  absl::Status Wait(float* out) override { return local_.Wait(out); }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  int begun() {
    absl::MutexLock lock(&mu_);
    return begun_;
  }

 private:
  LocalRoutedMoe local_;
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = true;
  int begun_ ABSL_GUARDED_BY(mu_) = 0;
};

class AttentionLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
        Checkpoint::Open(RandomCheckpointDir("k3-tiny", 7));
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(
        std::shared_ptr<const Checkpoint>(std::move(*checkpoint)), WeightSelection::All());
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    moe_ = std::make_unique<HeldMoe>(weights_.get());
    AttentionServerOptions options;
    options.node.host = "127.0.0.1";
    options.max_streams_per_client = 2;
    options.max_request_bytes = 1024;
    absl::StatusOr<std::unique_ptr<AttentionServer>> server =
        AttentionServer::StartStandalone(options, weights_.get(), moe_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }
  void TearDown() override {
    if (moe_) moe_->Release();
    server_.reset();
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<HeldMoe> moe_;
  std::unique_ptr<AttentionServer> server_;
  std::string address_;
};

TEST_F(AttentionLimitsTest, StreamsBeyondThePerClientLimitAreResourceExhausted) {
  auto stub = v1::K3Serve::NewStub(ClientTls().Connect(address_));
  // Two streams in flight: their steps are held.
  grpc::ClientContext first_context, second_context;
  auto first = stub->Generate(&first_context, GreedyRequest("a", {1, 2, 3}, 2));
  auto second = stub->Generate(&second_context, GreedyRequest("b", {4, 5, 6}, 2));
  // Both hold their slots once the scheduler has them (the slot is taken before Submit).
  ASSERT_TRUE(WaitFor(
      [&] {
        grpc::ClientContext context;
        v1::ServerInfo info;
        return stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok() &&
               info.active_requests() == 2;
      },
      absl::Seconds(30)));
  absl::StatusOr<GenerateOutcome> third =
      GenerateOverGrpc(address_, GreedyRequest("c", {7, 8}, 1), absl::Seconds(10));
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_TRUE(absl::StrContains(third.status().message(), "--max-streams-per-client"))
      << third.status();
  moe_->Release();
  v1::GenerateResponse response;
  while (first->Read(&response)) {
  }
  const grpc::Status first_status = first->Finish();
  EXPECT_TRUE(first_status.ok()) << first_status.error_message();
  while (second->Read(&response)) {
  }
  const grpc::Status second_status = second->Finish();
  EXPECT_TRUE(second_status.ok()) << second_status.error_message();
  // The slots are free again. The server releases a stream's slot when its handler returns,
  // which may be just after the client has read the final status, so a refusal in that moment
  // is retried (briefly); any other outcome ends the wait.
  absl::StatusOr<GenerateOutcome> after = absl::UnknownError("not run");
  ASSERT_TRUE(WaitFor(
      [&] {
        after = GenerateOverGrpc(address_, GreedyRequest("d", {7, 8}, 1), absl::Seconds(30));
        return !absl::IsResourceExhausted(after.status());
      },
      absl::Seconds(5)))
      << after.status();
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST_F(AttentionLimitsTest, RequestsAboveTheSizeLimitAreRefused) {
  moe_->Release();
  std::vector<int32_t> long_prompt(2000, 100000);  // > 1024 bytes as varints
  absl::StatusOr<GenerateOutcome> big =
      GenerateOverGrpc(address_, GreedyRequest("big", long_prompt, 1), absl::Seconds(10));
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  absl::StatusOr<GenerateOutcome> small =
      GenerateOverGrpc(address_, GreedyRequest("small", {1, 2}, 1), absl::Seconds(30));
  EXPECT_TRUE(small.ok()) << small.status();
}

}  // namespace
}  // namespace k3
